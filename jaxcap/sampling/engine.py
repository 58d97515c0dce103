"""The paged rollout engine's host scheduler: decode slots refilled as samples finish, a paged KV cache.

A call queues every sample (G per prompt, prompt-major) and loops:

1. prefill: when the queue cannot fill the free slots, the next chunk of prompts (a bucketed `SamplerBatch`) is
   run once and its keys and values written into pages (each prompt right-aligned in ceil(real / Z) pages);
2. admit: queued samples take free slots, each with pages of its own for its max_new_tokens; their page tables
   start with their prompt's pages (shared by reference by the prompt's G samples);
3. compact: when the queue has run dry, live slots move into the smallest row bucket (a power of two) that holds
   them, so a long tail decodes at its own size;
4. a decode segment (`paged_decode.segment`) of up to `segment_steps` steps over the live bucket of pages (the
   pages any live slot can fill in the segment, up `jaxcap.buckets.ladder` at 2 sizes per octave), returning
   early once enough slots have finished to refill (1/8 of them) or, draining, to compact;
5. finished samples free their pages (a prompt's when its last sample finishes).

Pages are allocated whole at admission (a sample's own pages for its worst case), so a call never runs out of
pages mid-run: a sample waits in the queue until its pages are free. Programs compile once per (row bucket, page
bucket) and per prefill shape. Single process, unsharded (see `PagedSampler`).
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxcap.buckets import batch_bucket, ladder
from jaxcap.sampling import paged_decode as programs
from jaxcap.sampling.distribution import SamplingConfig
from jaxcap.sampling.paged_cache import NULL_PAGE, PagePool
from jaxcap.sampling.prompts import pad_length
from jaxcap.sampling.sampler import Rollouts, SampledArrays, Sampler, SamplerBatch

REFILL_FRACTION = 8  # a segment returns to refill once 1/8 of the slots (at least one) have finished


@dataclasses.dataclass(frozen=True)
class EngineConfig:
  """slots: decode slots (the largest row bucket); page_size: tokens per page; segment_steps: the most decode
  steps between two visits of the host; pages: the pool's pages (0 = as many as a call can use at once)."""

  slots: int = 64
  page_size: int = 16
  segment_steps: int = 32
  pages: int = 0

  def __post_init__(self):
    for name in ("slots", "page_size", "segment_steps"):
      if getattr(self, name) < 1:
        raise ValueError(f"rollout.{name}={getattr(self, name)}; it must be at least 1")
    if self.pages < 0:
      raise ValueError(f"rollout.pages={self.pages}; use 0 (as many as a call needs) or a positive count")


@dataclasses.dataclass
class _Prompt:
  pages: list[int]
  start: int  # left padding in the first page
  position: int  # mRoPE position of its last token
  remaining: int  # samples not yet finished


class PageAllocator:
  """Free page ids 1 .. P - 1 (page 0 is the null page)."""

  def __init__(self, pages: int):
    self.free = list(range(pages - 1, NULL_PAGE, -1))

  def take(self, n: int) -> list[int]:
    out = [self.free.pop() for _ in range(n)]
    return out

  def give(self, pages: Sequence[int]) -> None:
    self.free.extend(pages)


def generate(
  params,
  chunks: Sequence[SamplerBatch],
  key: jax.Array,
  *,
  graphdef,
  cfg,
  engine: EngineConfig,
  sampling: SamplingConfig,
  num_samples: int,
  pad_id: int,
  max_lengths: np.ndarray | None = None,
  stats: dict | None = None,
) -> SampledArrays:
  """G samples of every real prompt of `chunks` (host `SamplerBatch`es, in order). Output rows: chunk c's block
  of `block * G` rows after the earlier chunks', row (offset + b) * G + g sample g of its prompt b; padded prompts'
  rows are left empty (length 0). `max_lengths` int [O] (optional): a per-row cap on emitted tokens (a stop
  schedule for benchmarks). `stats`, when given, is filled with segment / compile counts."""
  g, n_new, z = num_samples, sampling.max_new_tokens, engine.page_size
  stop_ids = sampling.resolve_stop_ids(cfg.eos_token_id)
  offsets = np.cumsum([0] + [c.block for c in chunks])
  out_rows = int(offsets[-1]) * g
  own_pages = math.ceil((n_new - 1) / z)
  chunk_pages = [_prompt_pages(c, z) for c in chunks]
  most = max((int(p.max()) for p in chunk_pages if p.size), default=0)
  if engine.pages:
    total_pages = engine.pages
    for c, pp in enumerate(chunk_pages):
      for b, p in enumerate(pp):
        if p + own_pages > total_pages - 1:
          raise ValueError(
            f"prompt {b} of chunk {c} needs {p} pages of {z} tokens plus {own_pages} for its "
            f"max_new_tokens={n_new}, more than rollout.pages={total_pages} minus the null page; raise "
            f"rollout.pages (or rollout.page_size), or lower sampling.max_new_tokens"
          )
  else:
    biggest_chunk = max((int(p.sum()) for p in chunk_pages), default=0)
    total_pages = 1 + engine.slots * (own_pages + most) + biggest_chunk

  text = cfg.text
  pool = PagePool.zeros(text.num_hidden_layers, total_pages, z, text.num_key_value_heads, text.head_dim, cfg.dtype)
  alloc = PageAllocator(total_pages)
  out = programs.Outputs.empty(out_rows, n_new, pad_id)
  limits = np.full(out_rows, n_new, np.int64) if max_lengths is None else np.minimum(max_lengths, n_new)
  model_static = dict(graphdef=graphdef, sampling=sampling, num_samples=g)

  rows = engine.slots
  slots = programs.Slots.empty(rows, out_rows)
  slot_row = np.full(rows, -1, np.int64)  # host mirror: output row per slot, -1 = free
  slot_pages: list[list[int]] = [[] for _ in range(rows)]
  slot_table = np.zeros((rows, 0), np.int32)
  slot_base = np.zeros(rows, np.int64)  # positions in its prompt's pages
  slot_emitted = np.zeros(rows, np.int64)
  slot_start = np.zeros(rows, np.int64)
  prompts: dict[int, _Prompt] = {}
  queue: collections.deque = collections.deque()
  pending = collections.deque(range(len(chunks)))
  segments = 0

  def prefill_next():
    nonlocal pool, out
    c = pending.popleft()
    chunk = chunks[c]
    padded = pad_length(chunk.prompts, -(-chunk.prompts.length // z) * z, pad_id)
    blocks = padded.length // z
    need = chunk_pages[c]
    page_ids = np.zeros((chunk.block, blocks), np.int32)
    real = np.asarray(padded.attention_mask).sum(-1)
    deltas = np.asarray(padded.rope_deltas)
    for b in range(chunk.rows):
      pages = alloc.take(int(need[b]))
      page_ids[b, blocks - len(pages) :] = pages
      prompt = int(offsets[c]) + b
      prompts[prompt] = _Prompt(pages, len(pages) * z - int(real[b]), int(real[b] + deltas[b]) - 1, g)
      queue.extend((prompt, s) for s in range(g))
    placed = jax.tree.map(jnp.asarray, padded)
    pool, out = programs.prefill_jit(
      params,
      placed,
      pool,
      out,
      jnp.asarray(page_ids),
      jnp.int32(offsets[c]),
      jnp.int32(chunk.rows),
      key,
      **model_static,
    )

  def can_prefill() -> bool:
    if not pending:
      return False
    need = int(chunk_pages[pending[0]].sum()) + own_pages
    return len(alloc.free) >= need

  while True:
    free = [i for i in range(rows) if slot_row[i] < 0]
    while pending and len(queue) < len(free) and can_prefill():
      prefill_next()
    if pending and not queue and not (slot_row >= 0).any():
      raise ValueError(  # unreachable with pages=0; a budget too small for one chunk's prompts at once
        f"chunk {pending[0]} needs {int(chunk_pages[pending[0]].sum())} pages for its prompts plus {own_pages} "
        f"for a sample, more than rollout.pages={total_pages} holds; raise rollout.pages or use smaller chunks"
      )
    admitted = []
    while queue and free and len(alloc.free) >= own_pages:
      prompt, s = queue.popleft()
      i = free.pop(0)
      p = prompts[prompt]
      slot_row[i] = prompt * g + s
      slot_pages[i] = alloc.take(own_pages)
      table = p.pages + slot_pages[i]
      if len(table) > slot_table.shape[1]:
        slot_table = np.pad(slot_table, ((0, 0), (0, len(table) - slot_table.shape[1])))
      slot_table[i] = 0
      slot_table[i, : len(table)] = table
      slot_base[i], slot_start[i], slot_emitted[i] = len(p.pages) * z, p.start, 1
      admitted.append((i, prompt * g + s, p))
    if admitted:
      a = np.full((6, rows), 0, np.int64)
      a[0] = rows
      for j, (i, row, p) in enumerate(admitted):
        a[:, j] = (i, row, limits[row], slot_start[i], slot_base[i], p.position)
      slots = programs.admit_jit(slots, out, *(jnp.asarray(x, jnp.int32) for x in a), stop_ids=stop_ids)
    live = int((slot_row >= 0).sum())
    if live == 0 and not queue and not pending:
      break
    if live == 0:
      raise ValueError(
        f"no sample fits: {len(alloc.free)} free pages of rollout.pages={total_pages}, {own_pages} needed for one "
        f"sample's max_new_tokens={n_new}; raise rollout.pages or lower sampling.max_new_tokens"
      )
    draining = not queue and not pending
    if draining and batch_bucket(live) < rows:
      keep = np.flatnonzero(slot_row >= 0)
      rows = batch_bucket(live)
      index = np.full(rows, -1, np.int64)
      index[: len(keep)] = keep
      slots = programs.compact_jit(slots, jnp.asarray(index, jnp.int32), out_rows=out_rows)
      pick = lambda a, fill: np.where((index >= 0).reshape(-1, *([1] * (a.ndim - 1))), a[np.maximum(index, 0)], fill)
      slot_row, slot_table = pick(slot_row, -1), pick(slot_table, 0)
      slot_base, slot_start, slot_emitted = pick(slot_base, 0), pick(slot_start, 0), pick(slot_emitted, 0)
      slot_pages = [slot_pages[k] if k >= 0 else [] for k in index]
    # the live bucket: pages any live slot can fill during this segment, up the ladder (2 sizes per octave)
    reach = np.where(slot_row >= 0, slot_base + slot_emitted - 1 + engine.segment_steps, 0)
    width = min(ladder(max(1, int(math.ceil(reach.max() / z))), 1, 2), slot_table.shape[1])
    if draining:
      stop_live = batch_bucket(live) // 2 if rows > 1 else 0
    else:
      stop_live = max(0, live - max(1, rows // REFILL_FRACTION))
    pool, slots, out = programs.segment_jit(
      params,
      pool,
      slots,
      out,
      jnp.asarray(slot_table[:, :width]),
      key,
      jnp.int32(stop_live),
      stop_ids=stop_ids,
      steps=engine.segment_steps,
      **model_static,
    )
    segments += 1
    done, emitted = jax.device_get((slots.done, slots.emitted))
    for i in np.flatnonzero((slot_row >= 0) & done):
      prompt = int(slot_row[i]) // g
      alloc.give(slot_pages[i])
      slot_pages[i], slot_row[i] = [], -1
      p = prompts[prompt]
      p.remaining -= 1
      if p.remaining == 0:
        alloc.give(p.pages)
        del prompts[prompt]
    slot_emitted = np.asarray(emitted, np.int64)

  if stats is not None:
    stats.update(segments=segments, pages=total_pages, free_pages=len(alloc.free), traces=dict(programs.TRACE_COUNTS))
  return SampledArrays(out.tokens, out.sample_logprobs, out.policy_logprobs, out.lengths)


def _prompt_pages(chunk: SamplerBatch, z: int) -> np.ndarray:
  """Pages of `z` tokens each real prompt of `chunk` fills: ceil(real tokens / z), int [rows]."""
  real = np.asarray(chunk.prompts.attention_mask)[: chunk.rows].sum(-1)
  return -(-real // z)


class PagedSampler(Sampler):
  """A `Sampler` (same bucketing, same `Rollouts`) whose calls run the paged engine (`generate`): `engine` sets
  its slots, page size and segment length. One process, one device: the static sampler serves meshes and
  multi-host runs."""

  wants_host_batch = True  # a host `SamplerBatch` saves copying a placed one back

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
  ) -> Rollouts:
    """As `Sampler.__call__`; `max_lengths` / `stats` as `generate`'s."""
    mesh = jax.sharding.get_abstract_mesh()
    if jax.process_count() > 1 or (not mesh.empty and mesh.size > 1):
      raise ValueError(
        "rollout.engine='paged' runs on one process and one device for now; use rollout.engine='static' on a "
        f"mesh of {'?' if mesh.empty else mesh.size} devices / {jax.process_count()} processes"
      )
    if num_samples < 1:
      raise ValueError(f"num_samples={num_samples}; ask for at least one sample per prompt")
    batch = prompts if isinstance(prompts, SamplerBatch) else self.bucket(prompts)
    if batch.on_device:
      batch = dataclasses.replace(batch, prompts=jax.device_get(batch.prompts))
    arrays = generate(
      self.params if params is None else params,
      [batch],
      key,
      graphdef=self.graphdef,
      cfg=self.cfg,
      engine=self.engine,
      sampling=sampling or self.sampling,
      num_samples=num_samples,
      pad_id=self.pad_id,
      max_lengths=max_lengths,
      stats=stats,
    )
    return Rollouts(
      arrays, rows=batch.rows, num_samples=num_samples, first_row=0, tokenizer=self.tokenizer, multi=False
    )
