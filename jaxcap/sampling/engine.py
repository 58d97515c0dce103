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

from jaxcap.sampling import mesh_shards
from jaxcap.sampling.distribution import SamplingConfig
from jaxcap.sampling.generate import compute_dtype_params
from jaxcap.sampling.paged_attention import ATTENTION_CHOICES
from jaxcap.sampling.placement import SamplerBatch
from jaxcap.sampling.rollouts import Rollouts, SampledArrays
from jaxcap.sampling.sampler import Sampler
from jaxcap.sampling.scheduler import generate, shard


@dataclasses.dataclass(frozen=True)
class EngineConfig:
  """slots: decode slots (the largest row bucket); page_size: tokens per page; segment_steps: the most decode
  steps between two visits of the host; pages: the pool's pages (0 = as many as a call can use at once); slots
  and pages are each device's on a mesh (`jaxcap.sampling.mesh_shards`);
  attention: the decode attention, 'auto' (JAX's Pallas paged-attention kernel on TPU and GPU, blocked jnp
  attention on CPU), 'reference' or 'pallas' (`jaxcap.sampling.paged_attention.choose`)."""

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


def make_sampler(model, *, engine: EngineConfig | None = None, **kw) -> Sampler:
  """The one builder of a sampler (the trainer's rollouts, the annotator, the benchmarks): the static-batch `Sampler`
  for `engine` None, else the paged engine with its settings; `kw` are `Sampler`'s (processor, sampling,
  length_multiple, bucket_steps, owns_weights)."""
  return Sampler(model, **kw) if engine is None else PagedSampler(model, engine=engine, **kw)


class PagedSampler(Sampler):
  """A `Sampler` (same bucketing, same `Rollouts`) whose calls run the paged engine (`generate`): `engine` sets
  its slots, page size and segment length. On a mesh or several processes, data parallel: one engine per block
  of prompts the mesh gives a device (`jaxcap.sampling.mesh_shards`)."""

  wants_host_batch = True  # a host `SamplerBatch` saves copying a placed one back
  streams_groups = True  # calls take `on_group`: each prompt's G samples handed over as soon as they are done

  def __init__(self, model, tokenizer=None, *, engine: EngineConfig = EngineConfig(), **kw):
    super().__init__(model, tokenizer, **kw)
    self.engine = engine
    self._own_weights = None  # the sampler's own params in the compute dtype, cast on first use

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

  def rounds(
    self,
    feed,
    key: jax.Array,
    *,
    num_samples: int = 1,
    sampling: SamplingConfig | None = None,
    max_lengths: np.ndarray | None = None,
    on_group=None,
  ):
    """The engine over a stream of chunks and weights (`feed`: `jaxcap.sampling.chunk_feed`; partial rollouts,
    `jaxcap.train.rollouts.partial`) on the default device: a generator stepping once per decode segment, which
    hands each chunk back to `feed.finished` as it completes; under a mesh of several devices, one engine per
    device's block of every chunk (`mesh_stream`). Weights come from the feed, in the compute dtype;
    `max_lengths` and `on_group` as `scheduler.shard`'s (over every chunk's rows; a group numbered by its prompt
    across the chunks)."""
    kw = dict(graphdef=self.graphdef, cfg=self.cfg, engine=self.engine, sampling=sampling or self.sampling)
    kw.update(num_samples=num_samples, pad_id=self.pad_id, max_lengths=max_lengths, on_group=on_group)
    mesh = jax.sharding.get_mesh()
    if mesh is not None and not mesh.empty and mesh.size > 1:  # one engine per device's block of every chunk
      from jaxcap.sampling.mesh_stream import stream

      return stream(feed, key, mesh=mesh, **kw)
    return shard(None, None, key, feed=feed, **kw)

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
    of the p-th prompt of the call (counting every batch's padded block) draws from (key, p, g, position);
    `on_group` gets that p. Under a mesh of several devices, or with several processes, each device runs the engine over its block of
    the prompts (`mesh_shards`: how prompts are spread; p then counts the global batch's prompts, and `on_group`
    this process's)."""
    if num_samples < 1:
      raise ValueError(f"num_samples={num_samples}; ask for at least one sample per prompt")
    chunks = []
    for prompts in batches:
      batch = prompts if isinstance(prompts, SamplerBatch) else self.bucket(prompts)
      if batch.on_device:
        batch = dataclasses.replace(batch, prompts=jax.device_get(batch.prompts))
      chunks.append(batch)
    kw = dict(graphdef=self.graphdef, cfg=self.cfg, engine=self.engine, sampling=sampling or self.sampling)
    kw.update(num_samples=num_samples, pad_id=self.pad_id, max_lengths=max_lengths, stats=stats, on_group=on_group)
    # the weights in the compute dtype once per call (the sampler's own: once), as every engine program would cast
    # them: on a mesh each device then holds a whole bfloat16 copy, not the float32 masters, and no segment
    # re-reads float32
    if params is None:
      if self._own_weights is None:
        self._own_weights = compute_dtype_params(self.params, self.cfg.dtype)
      params = self._own_weights
    else:
      params = compute_dtype_params(params, self.cfg.dtype)
    mesh = jax.sharding.get_mesh()
    if jax.process_count() > 1 or not (mesh is None or mesh.empty or mesh.size == 1):
      if mesh is None or mesh.empty:
        raise ValueError("the paged engine on several processes needs an ambient mesh: call it under jax.set_mesh")
      parts, firsts = mesh_shards.generate(params, chunks, key, mesh=mesh, **kw)
    else:
      arrays = generate(params, chunks, key, **kw)
      parts, firsts, lo = [], [0] * len(chunks), 0
      for batch in chunks:
        hi = lo + batch.block * num_samples
        parts.append(SampledArrays(*(getattr(arrays, f.name)[lo:hi] for f in dataclasses.fields(arrays))))
        lo = hi
      parts = [arrays] if len(chunks) == 1 else parts
    multi = jax.process_count() > 1
    return [
      Rollouts(part, rows=batch.rows, num_samples=num_samples, first_row=first, tokenizer=self.tokenizer, multi=multi)
      for part, batch, first in zip(parts, chunks, firsts)
    ]
