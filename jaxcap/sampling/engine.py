"""The paged rollout engine's entry points: `EngineConfig` (the `rollout` block's slots, page size, segment length,
pool size and decode attention) and `PagedSampler`, a `Sampler` whose calls run the host scheduler
(`jaxcap.sampling.scheduler`: decode slots refilled as samples finish, a paged KV cache whose prompt pages a
prompt's G samples share).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import numpy as np

from jaxcap.sampling.distribution import SamplingConfig
from jaxcap.sampling.paged_attention import ATTENTION_CHOICES
from jaxcap.sampling.placement import SamplerBatch
from jaxcap.sampling.rollouts import Rollouts, SampledArrays
from jaxcap.sampling.sampler import Sampler
from jaxcap.sampling.scheduler import generate


@dataclasses.dataclass(frozen=True)
class EngineConfig:
  """slots: decode slots (the largest row bucket); page_size: tokens per page; segment_steps: the most decode
  steps between two visits of the host; pages: the pool's pages (0 = as many as a call can use at once);
  attention: the decode attention, 'auto' (JAX's Pallas paged-attention kernel on TPU and GPU, the jnp reference
  on CPU), 'reference' or 'pallas' (`jaxcap.sampling.paged_attention.choose`)."""

  slots: int = 64
  page_size: int = 16
  segment_steps: int = 32
  pages: int = 0
  attention: str = "auto"

  def __post_init__(self):
    for name in ("slots", "page_size", "segment_steps"):
      if getattr(self, name) < 1:
        raise ValueError(f"rollout.{name}={getattr(self, name)}; it must be at least 1")
    if self.pages < 0:
      raise ValueError(f"rollout.pages={self.pages}; use 0 (as many as a call needs) or a positive count")
    if self.attention not in ATTENTION_CHOICES:
      raise ValueError(f"rollout.attention={self.attention!r}; use one of {', '.join(ATTENTION_CHOICES)}")


class PagedSampler(Sampler):
  """A `Sampler` (same bucketing, same `Rollouts`) whose calls run the paged engine (`generate`): `engine` sets
  its slots, page size and segment length. One process, one device: the static sampler serves meshes and
  multi-host runs."""

  wants_host_batch = True  # a host `SamplerBatch` saves copying a placed one back
  streams_groups = True  # calls take `on_group`: each prompt's G samples handed over as soon as they are done

  def __init__(self, model, tokenizer=None, *, engine: EngineConfig = EngineConfig(), **kw):
    super().__init__(model, tokenizer, **kw)
    self.engine = engine

  def __call__(
    self,
    prompts,
    key: jax.Array,
    *,
    num_samples: int = 1,
    sampling: SamplingConfig | None = None,
    params=None,
    max_lengths: np.ndarray | None = None,
    stats: dict | None = None,
    on_group=None,
  ) -> Rollouts:
    """As `Sampler.__call__`; `max_lengths` / `stats` / `on_group` as `scheduler.generate`'s."""
    kw = dict(num_samples=num_samples, sampling=sampling, params=params, max_lengths=max_lengths, stats=stats)
    kw["on_group"] = on_group
    return self.stream([prompts], key, **kw)[0]

  def stream(
    self,
    batches: Sequence,
    key: jax.Array,
    *,
    num_samples: int = 1,
    sampling: SamplingConfig | None = None,
    params=None,
    max_lengths: np.ndarray | None = None,
    stats: dict | None = None,
    on_group=None,
  ) -> list[Rollouts]:
    """Several batches (each as `__call__` takes it: conversations, `ModelInputs` or a `SamplerBatch`) through one
    engine call, so the slots stay full across batches (a later batch's samples take the slots an earlier one's
    free) and only the last one's tail decodes at a small row bucket. One `Rollouts` per batch, in order. Sample g
    of the p-th prompt of the call (counting every batch's padded block) draws from (key, p, g, position); `on_group` gets that p."""
    mesh = jax.sharding.get_abstract_mesh()
    if jax.process_count() > 1 or (not mesh.empty and mesh.size > 1):
      raise ValueError(
        "rollout.engine='paged' runs on one process and one device for now; use rollout.engine='static' on a "
        f"mesh of {'?' if mesh.empty else mesh.size} devices / {jax.process_count()} processes"
      )
    if num_samples < 1:
      raise ValueError(f"num_samples={num_samples}; ask for at least one sample per prompt")
    chunks = []
    for prompts in batches:
      batch = prompts if isinstance(prompts, SamplerBatch) else self.bucket(prompts)
      if batch.on_device:
        batch = dataclasses.replace(batch, prompts=jax.device_get(batch.prompts))
      chunks.append(batch)
    arrays = generate(
      self.params if params is None else params,
      chunks,
      key,
      graphdef=self.graphdef,
      cfg=self.cfg,
      engine=self.engine,
      sampling=sampling or self.sampling,
      num_samples=num_samples,
      pad_id=self.pad_id,
      max_lengths=max_lengths,
      stats=stats,
      on_group=on_group,
    )
    out, lo = [], 0
    for batch in chunks:
      hi = lo + batch.block * num_samples
      part = (
        SampledArrays(*(getattr(arrays, f.name)[lo:hi] for f in dataclasses.fields(arrays)))
        if len(chunks) > 1
        else arrays
      )
      out.append(
        Rollouts(part, rows=batch.rows, num_samples=num_samples, first_row=0, tokenizer=self.tokenizer, multi=False)
      )
      lo = hi
    return out
