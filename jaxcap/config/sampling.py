"""How RL draws its captions: the sampling block (temperature, top-p / top-k, the longest caption) and the rollout
engine's."""

from __future__ import annotations

import dataclasses

from jaxcap.choices import ROLLOUT_ATTENTION, ROLLOUT_ENGINES
from jaxcap.fields import ALLOWED, ALTERS, Block, field
from jaxcap.sampling.distribution import SamplingConfig
from jaxcap.sampling.engine import EngineConfig  # the runtime classes declare the defaults


@dataclasses.dataclass(frozen=True)
class Sampling(Block):
  """How RL draws captions (jaxcap.sampling.SamplingConfig)."""

  temperature: float = field(SamplingConfig.temperature, "logits are divided by it", ge=0, hint="0 = greedy")
  top_p: float = field(SamplingConfig.top_p, "nucleus: the smallest most-likely set of this mass", gt=0, le=1)
  top_k: int = field(SamplingConfig.top_k, "keep the k most likely tokens", ge=0, hint="0 = off")
  max_new_tokens: int = field(SamplingConfig.max_new_tokens, "the longest caption, in tokens", ge=1)


@dataclasses.dataclass(frozen=True)
class Rollout(Block):
  """Which engine generates the RL rollouts (jaxcap.sampling.engine for 'paged'). The engine changes which random
  numbers a sample draws; slots, pages and segments change only the time (and float rounding) of a rollout. On a
  mesh and over processes the paged engine is data parallel: slots and pages are per device, each device's over
  its block of the prompts (jaxcap.sampling.mesh_shards)."""

  RESUME = ALLOWED
  engine: str = field(
    "static",
    "'static': one batch to the longest caption; 'paged': decode slots refilled as samples finish",
    choices=ROLLOUT_ENGINES,
    resume=ALTERS,
  )
  slots: int = field(EngineConfig.slots, "decode slots of the paged engine (rows decoded at once), per device", ge=1)
  page_size: int = field(EngineConfig.page_size, "tokens per KV-cache page", ge=1)
  segment_steps: int = field(EngineConfig.segment_steps, "most decode steps between two refills of the slots", ge=1)
  pages: int = field(
    EngineConfig.pages, "pages in the KV-cache pool, per device", ge=0, hint="0 = as many as a call can use at once"
  )
  attention: str = field(
    EngineConfig.attention,
    "the paged engine's decode attention: 'auto' (JAX's Pallas paged-attention kernel on TPU / GPU, blocked jnp "
    "attention on CPU), 'reference' (the jnp reference) or 'pallas'",
    choices=ROLLOUT_ATTENTION,
  )
  # disaggregated placement (jaxcap.train.rollouts.placement): rollouts on devices of their own, the learner on the rest
  devices: int = field(
    0,
    "devices of each process given to the rollouts; the learner's mesh (mesh.shape) takes the others",
    ge=0,
    hint="0 = colocated: rollouts and updates share every device; > 0 needs rl.max_staleness >= 1",
  )

  def check(self, run, at):
    if self.devices and not run.rl.max_staleness:
      yield (
        f"{at}devices={self.devices} splits rollouts from the learner, which then wait on each other every step; "
        "set rl.max_staleness >= 1 (rounds rolled out while the learner updates) or rollout.devices=0"
      )
