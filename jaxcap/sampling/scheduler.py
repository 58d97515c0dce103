"""The paged rollout engine's host scheduler: decode slots refilled as samples finish, a paged KV cache.

A call queues every sample (G per prompt, prompt-major) and loops:

1. prefill: when the queue cannot fill the free slots, the next chunk of prompts (a bucketed `SamplerBatch`) is
   run once and its keys and values written into pages (each prompt left-aligned in ceil(real / Z) pages); a
   hybrid decoder's (Qwen3.5) recurrent states after each prompt go to a row of the pool's store of prompt states
   (`page_budget.StateRows`), held until the prompt's last sample finishes;
2. admit: queued samples take free slots, each with pages of its own for its max_new_tokens, the first a copy of
   its prompt's partly filled last page (when it has one); their page tables start with their prompt's full pages
   (shared by reference by the prompt's G samples); a hybrid decoder's slot gets a copy of its prompt's recurrent
   states over whatever its previous sample left, which its decode steps then advance (live slots only);
3. compact: when the queue has run dry, live slots move into the smallest row bucket that holds them (the ladder
   of `jaxcap.buckets` at 2 sizes per octave: 32, 24, 16, 12, ...), so a long tail decodes at its own size;
4. a decode segment (`paged_decode.segment`) of up to `segment_steps` steps over the live bucket of pages (the
   pages any live slot can fill in the segment, up the same ladder), returning early once enough slots have
   finished to refill (1/8 of them) or, draining, to compact into the next smaller row bucket; its attention is
   `rollout.attention`'s for this backend (`paged_attention.choose`);
5. finished samples free their pages (a prompt's when its last sample finishes); with `on_group`, each prompt whose
   G samples are all done is handed over then (its tokens copied to the host), e.g. to be judged while the
   others decode (streaming judging).

Programs compile once per (row bucket, page bucket) and per prefill shape. One device (`shard`); on a mesh or
several processes, one `shard` per device's block of prompts (`jaxcap.sampling.mesh_shards`). `stats` counts
where a call's work goes (see `shard`).
"""

from __future__ import annotations

import collections
import math
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxcap.buckets import ladder
from jaxcap.sampling import paged_attention, paged_slots
from jaxcap.sampling import paged_decode as programs
from jaxcap.sampling.distribution import SamplingConfig
from jaxcap.sampling.host_slots import BUCKET_STEPS, REFILL_FRACTION, HostSlots, row_bucket, smaller_bucket
from jaxcap.sampling.chunk_feed import ChunkBook, EagerFeed, TokenVersions
from jaxcap.sampling.page_budget import chunk_too_big, no_sample_fits, PageAllocator, PromptPages, own_pages
from jaxcap.sampling.page_budget import StateRows, state_rows
from jaxcap.sampling.paged_cache import NULL_PAGE, PagePool, grow_pool, grow_states, recurrent_zeros
from jaxcap.sampling.prompts import pad_length
from jaxcap.sampling.placement import SamplerBatch
from jaxcap.sampling.rollouts import SampledArrays


def generate(params, chunks: Sequence[SamplerBatch], key: jax.Array, **kw) -> SampledArrays:
  """G samples of every real prompt of `chunks` (host `SamplerBatch`es, in order) on the default device: one
  `shard` run to its end. Keywords as `shard`'s."""
  return run_to_end(shard(params, chunks, key, **kw))


def run_to_end(run):
  """Drives a `shard` generator to its end; its return value."""
  while True:
    try:
      next(run)
    except StopIteration as done:
      return done.value


def shard(
  params,
  chunks: Sequence[SamplerBatch] | None,
  key: jax.Array,
  *,
  graphdef,
  cfg,
  engine,
  sampling: SamplingConfig,
  num_samples: int,
  pad_id: int,
  max_lengths: np.ndarray | None = None,
  stats: dict | None = None,
  on_group: Callable[[int, np.ndarray, np.ndarray], None] | None = None,
  numbers: np.ndarray | None = None,
  groups: np.ndarray | None = None,
  embed: Callable[[int], tuple | None] = lambda c: None,
  feed=None,
):
  """The engine on one device (its arrays where `params` are, or the default device), as a generator that yields
  once per decode segment, right after dispatching it (so a caller can run several devices' shards in turn,
  `mesh_shards`), and returns the `SampledArrays`. Output rows: chunk c's block of `block * G` rows after the
  earlier chunks', row (offset + b) * G + g sample g of its prompt b; padded prompts' rows are left empty (length
  0). Its draws are keyed as row numbers[offset + b] * G + g (`numbers` int [sum of blocks]; default: the
  output's prompt numbering). `engine`: an `EngineConfig`. `max_lengths` int [O] (optional): a per-row cap on
  emitted tokens (a stop schedule for benchmarks). `stats`, when given, is filled with: segments, compactions,
  row_steps (decode steps x compiled rows, summed over segments), attention_positions (row steps x page-bucket
  positions each row read), host_s (wall seconds between a segment's results arriving and the next segment's
  dispatch: the scheduler's own time), pages, free_pages and the programs' trace counts. `on_group(prompt, tokens
  int32 [G, N], lengths int32 [G])`, when given, is called on this thread once per real prompt (numbered
  groups[offset + b], default as the output rows are), as soon as its G samples have finished, with their host
  copies. `embed(c)`: chunk c's `embed_vision` on this device, or None to embed it in the prefill.

  `feed` (a stream, `jaxcap.sampling.chunk_feed`; then `params` and `chunks` are None): chunks and weights come
  from it as the engine needs them, chunk c entering only once every chunk before c - feed.ahead has finished,
  each finished chunk handed back with its tokens' weights versions; output rows are reused (`feed.ring`), and
  the generator returns None."""
  feed = EagerFeed(params, chunks) if feed is None else feed
  g, n_new, z = num_samples, sampling.max_new_tokens, engine.page_size
  stop_ids = sampling.resolve_stop_ids(cfg.eos_token_id)
  book = ChunkBook(feed, g, z, n_new)
  offsets, count, out_rows, out_row = book.offsets, book.count, book.out_rows, book.out_row
  numbers = np.arange(offsets[-1]) if numbers is None else np.asarray(numbers)
  groups = numbers if groups is None else np.asarray(groups)
  total_pages = book.pool_pages(engine)
  own = lambda prompt: int(own_pages(n_new, z, prompts[prompt].real % z))  # a queued sample's own pages
  attention = paged_attention.choose(
    engine.attention, jax.default_backend(), cache_dtype=cfg.dtype, page_size=z, head_dim=cfg.text.head_dim
  )

  # a decoder with recurrent layers: each prompt in flight's states in a row of the pool's store, each slot's own
  recurrent = bool(recurrent_zeros(cfg, 0))
  stored = StateRows(state_rows(engine.slots, feed.blocks) if recurrent else 0)
  pool = PagePool.for_model(cfg, total_pages, z, stored.rows)
  alloc = PageAllocator(total_pages)
  out = paged_slots.Outputs.empty(out_rows, n_new, pad_id)
  limits = np.full(int(offsets[-1]) * g, n_new, np.int64) if max_lengths is None else np.minimum(max_lengths, n_new)
  model_static = dict(graphdef=graphdef, sampling=sampling, num_samples=g)
  current, version = feed.weights(0)
  weights = programs.SegmentWeights(current, graphdef)
  versions = TokenVersions(out_rows, n_new) if feed.ring else None

  rows = engine.slots
  slots = paged_slots.Slots.empty(rows, out_rows, recurrent_zeros(cfg, rows))
  host = HostSlots(rows)
  prompts: dict[int, PromptPages] = {}
  queue: collections.deque = collections.deque()
  pending = collections.deque(range(count))
  count_ = collections.Counter()
  host_s, since = 0.0, time.perf_counter()

  def use_weights() -> None:  # a stream's weights change when its oldest unfinished chunk does
    nonlocal current, version, weights
    params, v = feed.weights(min(book.oldest(), count - 1))
    if params is not current:
      current, version, weights = params, v, programs.SegmentWeights(params, graphdef)

  def prefill_next():
    nonlocal pool, out
    c = pending.popleft()
    chunk = feed.chunk(c)
    padded = pad_length(chunk.prompts, -(-chunk.prompts.length // z) * z, pad_id)
    blocks = padded.length // z
    page_ids = np.zeros((chunk.block, blocks), np.int32)
    real = np.asarray(padded.attention_mask).sum(-1)
    deltas = np.asarray(padded.rope_deltas)
    if recurrent and len(stored.free) < chunk.rows:  # beyond `state_rows`' bound: never, but grown rather than failed
      pool = grow_states(pool, stored.grow(stored.rows + chunk.rows - len(stored.free)))
    state_ids = np.full(chunk.block, stored.rows, np.int32)  # past the store: a padded prompt's, dropped
    for b in range(chunk.rows):
      pages = alloc.take(int(book.pages[c][b]))
      page_ids[b, : len(pages)] = pages
      prompt = int(offsets[c]) + b
      state = stored.take() if recurrent else 0
      state_ids[b] = state
      prompts[prompt] = PromptPages(pages, int(real[b]), int(real[b] + deltas[b]) - 1, g, state)
      queue.extend((prompt, s) for s in range(g))
    use_weights()
    placed = jax.tree.map(jnp.asarray, padded)
    first = out_row(int(offsets[c]) * g) // g
    pool, out = programs.prefill_jit(
      current,
      placed,
      pool,
      out,
      jnp.asarray(page_ids),
      jnp.int32(first),
      jnp.int32(chunk.rows),
      key,
      jnp.int32(numbers[offsets[c]]),
      embed(c),
      jnp.asarray(state_ids) if recurrent else None,
      **model_static,
    )
    book.left[c] = chunk.rows * g
    if versions is not None:
      versions.prefilled(np.arange(first * g, (first + chunk.rows) * g), version)
    if book.left[c] == 0:
      finish(c)

  def can_prefill() -> bool:
    nonlocal pool, total_pages
    if not pending or not book.admits(pending[0]):
      return False
    c = pending[0]
    if c not in book.real:  # a stream's next chunk: the pool grows to hold it beside the chunk before
      book.at_hand(c, feed.chunk(c))
      need = book.pool_pages(engine, [k for k in (c - 1, c) if k in book.real])
      if need > total_pages:
        pool, total_pages = grow_pool(pool, need), alloc.grow(need)
    return len(alloc.free) >= int(book.pages[c].sum()) + book.own[c]

  def finish(c: int) -> None:  # a stream's chunk c is done: handed back, its output rows free for reuse
    nonlocal out
    if feed.ring is None:
      return
    lo = out_row(int(offsets[c]) * g)
    span = slice(lo, lo + int(feed.blocks[c]) * g)
    part = SampledArrays(out.tokens[span], out.sample_logprobs[span], out.policy_logprobs[span], out.lengths[span])
    feed.finished(c, part, versions.take(span))
    out = paged_slots.clear_rows_jit(out, jnp.int32(lo), rows=int(feed.blocks[c]) * g, pad_id=pad_id)

  while True:
    free = [i for i in range(rows) if host.row[i] < 0]
    while pending and len(queue) < len(free) and can_prefill():
      prefill_next()
    if pending and not queue and not (host.row >= 0).any():
      if not book.admits(pending[0]):  # a device of a shared stream ahead of the others: wait for the oldest chunk
        yield
        continue
      # unreachable with pages=0; a budget too small for one chunk's prompts at once
      raise chunk_too_big(pending[0], int(book.pages[pending[0]].sum()), book.own[pending[0]], total_pages)
    admitted = np.zeros((9, rows), np.int64)
    admitted[0], admitted[7] = rows, total_pages  # slot index rows = no one; copy to page P = no copy
    j = 0
    while queue and free and len(alloc.free) >= own(queue[0][0]):
      prompt, s = queue.popleft()
      i, row, p = free.pop(0), prompt * g + s, prompts[prompt]
      pages = alloc.take(own(prompt))
      tail = host.place(i, row, p, pages, z)  # copied into its first own page
      copy = (NULL_PAGE, total_pages) if tail is None else (tail, pages[0])
      # its prompt's recurrent states copied over the slot's (a refilled slot keeps nothing of its last sample)
      admitted[:, j] = (i, out_row(row), numbers[prompt] * g + s, limits[row], host.base[i], p.position, *copy, p.state)
      j += 1
    if j:
      admit = (jnp.asarray(x, jnp.int32) for x in admitted)
      slots, pool = paged_slots.admit_jit(slots, out, pool, *admit, stop_ids=stop_ids)
    live = int((host.row >= 0).sum())
    if live == 0 and not queue and not pending:
      break
    if live == 0:
      raise no_sample_fits(len(alloc.free), total_pages, own(queue[0][0]), n_new)
    draining = not queue and not pending
    if draining and row_bucket(live, engine.slots) < rows:
      keep = np.flatnonzero(host.row >= 0)
      rows = row_bucket(live, engine.slots)
      index = np.full(rows, -1, np.int64)
      index[: len(keep)] = keep
      slots = paged_slots.compact_jit(slots, jnp.asarray(index, jnp.int32), out_rows=out_rows)
      host.take(index)
      count_["compactions"] += 1
    # the live bucket: pages any live slot can fill during this segment, up the ladder
    width = min(ladder(max(1, math.ceil(host.reach(engine.segment_steps) / z)), 1, BUCKET_STEPS), host.table.shape[1])
    stop_live = smaller_bucket(rows) if draining else max(0, live - max(1, rows // REFILL_FRACTION))
    use_weights()
    layers, head = weights.for_rows(rows)
    before, seg_version = host.emitted.copy(), version
    host_s += time.perf_counter() - since
    pool, slots, out, steps = programs.segment_jit(
      current,
      layers,
      head,
      pool,
      slots,
      out,
      jnp.asarray(host.table[:, :width]),
      key,
      jnp.int32(stop_live),
      stop_ids=stop_ids,
      steps=engine.segment_steps,
      attention=attention,
      **model_static,
    )
    yield
    done, emitted, steps = jax.device_get((slots.done, slots.emitted, steps))
    since = time.perf_counter()
    count_["segments"] += 1
    count_["row_steps"] += rows * int(steps)
    count_["attention_positions"] += rows * int(steps) * width * z
    emitted = np.asarray(emitted, np.int64)
    if versions is not None:
      busy = np.flatnonzero(host.row >= 0)
      versions.decoded(out_row(host.row[busy]), before[busy], emitted[busy], seg_version)
    complete, finished_chunks = [], []
    for i in np.flatnonzero((host.row >= 0) & done):
      prompt = int(host.row[i]) // g
      alloc.give(host.pages[i])
      host.pages[i], host.row[i] = [], -1
      p = prompts[prompt]
      p.remaining -= 1
      c = book.chunk_of(prompt)
      book.left[c] -= 1
      if book.left[c] == 0:
        finished_chunks.append(c)
      if p.remaining == 0:
        alloc.give(p.pages)
        if recurrent:
          stored.give(p.state)
        del prompts[prompt]
        complete.append(prompt)
    host.emitted = emitted
    if on_group is not None and complete:
      paged_slots.hand_over(on_group, out, complete, g, groups, out_row)
    for c in finished_chunks:
      finish(c)

  if stats is not None:
    host_s += time.perf_counter() - since
    stats.update(count_, host_s=host_s, pages=total_pages, free_pages=len(alloc.free))
    stats.update(state_rows=stored.rows, free_state_rows=len(stored.free))
    stats["traces"] = dict(paged_slots.TRACE_COUNTS)
  if feed.ring:
    return None
  return SampledArrays(out.tokens, out.sample_logprobs, out.policy_logprobs, out.lengths)
