"""The one place a run's programs are built from its config: the optimizer of each phase, the policy loss, the
sampling settings, the jitted SFT step, RL step and log-prob pass, and the static arguments of the sampler's
prefill and decode.

The trainer, `jaxcap.plan` and the benchmarks all call these, so the program a plan compiles (and says fits) is
the program the run executes:

    programs = RunPrograms(config, graphdef)
    opt = programs.optimizer("rl")
    step = programs.update("rl", opt, state_shardings)      # jax.jit(rl_step, donated state)
    old = programs.logprobs()(params, prompts, layout, tokens)

With `rl.micro_batch_tokens` > 0 the RL step and the log-prob pass are the packed ones (`packed_rl_step`,
`packed_sequence_logprobs`): the same call, with the step's `PackedInputs` where the padded ones take `layout`. A
packed run's programs are `ByLayout` pairs: a step whose packing does not pay (`rl.packing_min_saving`) hands them
its padded layout and runs the padded program (compiled only if some step does).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
from jaxcap.config.run import Run
import optax

from jaxcap.rl import PolicyLossConfig
from jaxcap.rl.rollout_correction import RolloutCorrectionConfig
from jaxcap.sampling import generate
from jaxcap.sampling.distribution import SamplingConfig
from jaxcap.train.steps.adapters import lora_rank
from jaxcap.train.packing.inputs import PackedInputs, packed_sequence_logprobs
from jaxcap.train.packing.steps import packed_rl_step, packed_sft_step
from jaxcap.train.steps.state import make_optimizer
from jaxcap.train.steps.updates import rl_step, sequence_logprobs, sft_step

PHASES = ("sft", "rl")


def phase_optimizer(config: Run, phase: str, steps: int | None = None):
  """AdamW + clipping + schedule of `phase` from its `optim` block, for `steps` updates (default: the phase's
  steps); the vision tower frozen when `<phase>.freeze_vision`."""
  p = getattr(config, phase)
  return make_optimizer(
    p.optim, int(p.steps if steps is None else steps), frozen=("visual",) if p.freeze_vision else ()
  )


def sampling_config(config: Run, **overrides) -> SamplingConfig:
  """The rollout distribution (`sampling` block); `overrides` e.g. temperature=0.0 for held-out greedy captions."""
  s = config.sampling
  fields = dict(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, max_new_tokens=s.max_new_tokens)
  return SamplingConfig(**(fields | overrides))


def rollout_engine(config: Run):
  """The paged engine's settings (`rollout` block) or None for rollout.engine='static'."""
  from jaxcap.sampling.engine import EngineConfig

  r = config.rollout
  if r.engine == "static":
    return None
  return EngineConfig(
    slots=r.slots, page_size=r.page_size, segment_steps=r.segment_steps, pages=r.pages, attention=r.attention
  )


def build_sampler(config: Run, model, processor, sampling, bucket_steps):
  """The run's rollout sampler: the static-batch `Sampler`, or the paged engine (`rollout.engine=paged`)."""
  from jaxcap.sampling.engine import make_sampler

  return make_sampler(
    model,
    engine=rollout_engine(config),
    processor=processor,
    sampling=sampling,
    length_multiple=config.data.pad_to_multiple,
    bucket_steps=bucket_steps,
  )


def policy_loss_config(config: Run) -> PolicyLossConfig:
  """The policy-gradient loss (`rl.loss`), with Dr.GRPO's constant set by the completion budget."""
  return PolicyLossConfig(max_gen_len=config.sampling.max_new_tokens, **config.rl.loss.to_dict())


def rollout_correction_config(config: Run) -> RolloutCorrectionConfig:
  """The behaviour / trainer correction (`rl.rollout_correction`)."""
  return RolloutCorrectionConfig(**config.rl.rollout_correction.to_dict())


def packs(config: Run, phase: str = "rl") -> bool:
  """Whether `phase`'s update (and RL's log-prob passes) run on packed rows (`<phase>.micro_batch_tokens` > 0)."""
  return getattr(config, phase).micro_batch_tokens > 0


def with_reference(config: Run, phase: str) -> bool:
  """Whether `phase`'s train state carries the frozen reference policy (RL with a KL term, without LoRA: with
  LoRA the reference is the base, the same params with the adapters off, `reference_is_base`)."""
  return phase == "rl" and config.rl.loss.kl_coef > 0 and not lora_rank(config)


def reference_is_base(config: Run, phase: str) -> bool:
  """Whether `phase`'s KL reference is the policy's own base with its LoRA adapters off (no copy)."""
  return phase == "rl" and config.rl.loss.kl_coef > 0 and lora_rank(config) > 0


@dataclasses.dataclass(frozen=True)
class ByLayout:
  """A packing phase's program: `packed` for a call given the step's `PackedInputs`, `padded` for one given its
  padded layout (a step whose packing does not pay, `jaxcap.train.packing.rows.packing_pays`); `.lower` the same."""

  packed: Callable
  padded: Callable

  def pick(self, args) -> Callable:
    return self.packed if any(isinstance(a, PackedInputs) for a in args) else self.padded

  def __call__(self, *args):
    return self.pick(args)(*args)

  def lower(self, *args):
    return self.pick(args).lower(*args)


@dataclasses.dataclass(frozen=True)
class RunPrograms:
  """The jitted programs of a run: `config` (the run config) and `graphdef` (the policy's nnx graph)."""

  config: Run
  graphdef: Any

  def optimizer(self, phase: str, steps: int | None = None) -> optax.GradientTransformation:
    return phase_optimizer(self.config, phase, steps)

  def step_fn(self, phase: str, optimizer: optax.GradientTransformation, packed: bool | None = None) -> Callable:
    """The pure update `(state, prompts, batch, layout) -> (state, metrics)` of `phase`, not jitted; `packed`:
    the packed step (default: whether the phase packs)."""
    c = self.config
    packed = packs(c, phase) if packed is None else packed
    if phase == "sft":
      return functools.partial(
        packed_sft_step if packed else sft_step,
        graphdef=self.graphdef,
        optimizer=optimizer,
        master_update=c.sft.optim.master_update,
        max_update_ratio=float(c.train.max_update_ratio),
      )
    if phase == "rl":
      return functools.partial(
        packed_rl_step if packed else rl_step,
        graphdef=self.graphdef,
        optimizer=optimizer,
        loss_config=policy_loss_config(c),
        estimator=c.rl.estimator,
        master_update=c.rl.optim.master_update,
        max_update_ratio=float(c.train.max_update_ratio),
        correction=rollout_correction_config(c),
        mask_truncated=c.rl.mask_truncated,
      )
    raise ValueError(f"phase {phase!r}: choose one of {', '.join(PHASES)}")

  def update(self, phase: str, optimizer: optax.GradientTransformation, state_shardings) -> Callable:
    """`jax.jit` of `step_fn`: the state donated and kept in `state_shardings` (a TrainState of shardings); a
    packing phase's is the `ByLayout` pair of the packed and padded steps."""
    jit = lambda packed: jax.jit(
      self.step_fn(phase, optimizer, packed), donate_argnums=0, out_shardings=(state_shardings, None)
    )
    return ByLayout(jit(True), jit(False)) if packs(self.config, phase) else jit(False)

  def logprobs(self) -> Callable:
    """`jax.jit(sequence_logprobs)`: (params, prompts, layout, tokens) -> log-probs [M, b*G, C]; with
    `rl.micro_batch_tokens` > 0 the `ByLayout` pair of it and `packed_sequence_logprobs` (`PackedInputs` for
    `layout`)."""
    padded = jax.jit(functools.partial(sequence_logprobs, self.graphdef))
    if not packs(self.config):
      return padded
    return ByLayout(jax.jit(functools.partial(packed_sequence_logprobs, self.graphdef)), padded)

  def sampling(self, **overrides) -> SamplingConfig:
    return sampling_config(self.config, **overrides)

  def generation_statics(self, model_cfg, pad_id: int, sampling: SamplingConfig | None = None) -> dict:
    """The static arguments of the sampler's `generate.prefill_jit` / `decode_jit` for this run's sampling."""
    return generate.static_arguments(self.graphdef, sampling or self.sampling(), model_cfg.eos_token_id, pad_id)
