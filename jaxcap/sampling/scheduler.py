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
where a call's work goes (see `shard`). The state the steps act on, and steps 1-3 and 5, are
`jaxcap.sampling.engine_state.EngineState`'s; `shard` runs the loop and the decode segments.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxcap.buckets import ladder
from jaxcap.sampling import paged_attention
from jaxcap.sampling import paged_decode as programs
from jaxcap.sampling.chunk_feed import EagerFeed
from jaxcap.sampling.distribution import SamplingConfig
from jaxcap.sampling.engine_state import EngineState
from jaxcap.sampling.host_slots import BUCKET_STEPS, REFILL_FRACTION, row_bucket, smaller_bucket
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
  state = EngineState(
    feed, key, graphdef=graphdef, cfg=cfg, engine=engine, sampling=sampling, num_samples=num_samples, pad_id=pad_id,
    max_lengths=max_lengths, numbers=numbers, embed=embed,
  )  # fmt: skip
  groups = state.numbers if groups is None else np.asarray(groups)
  z = engine.page_size
  attention = paged_attention.choose(
    engine.attention, jax.default_backend(), cache_dtype=cfg.dtype, page_size=z, head_dim=cfg.text.head_dim
  )
  host = state.host
  host_s, since = 0.0, time.perf_counter()

  while True:
    free = state.free_slots()
    state.prefill(len(free))
    if state.pending and not state.queue and not state.live():
      # a device of a shared stream ahead of the others: wait for the oldest chunk
      if not state.book.admits(state.pending[0]):
        yield
        continue
      raise state.too_small_for_chunk()  # unreachable with pages=0; a budget too small for one chunk's prompts at once
    state.admit(free)
    live = state.live()
    if state.all_finished():
      break
    if live == 0:
      raise state.too_small_for_sample()
    draining = not state.queue and not state.pending
    if draining and row_bucket(live, engine.slots) < state.rows:
      state.compact(live)
    rows = state.rows
    # the live bucket: pages any live slot can fill during this segment, up the ladder
    width = min(ladder(max(1, math.ceil(host.reach(engine.segment_steps) / z)), 1, BUCKET_STEPS), host.table.shape[1])
    stop_live = smaller_bucket(rows) if draining else max(0, live - max(1, rows // REFILL_FRACTION))
    state.use_weights()
    layers, head = state.weights.for_rows(rows)
    before, seg_version = host.emitted.copy(), state.version
    host_s += time.perf_counter() - since
    state.pool, state.slots, state.out, steps = programs.segment_jit(
      state.current,
      layers,
      head,
      state.pool,
      state.slots,
      state.out,
      jnp.asarray(host.table[:, :width]),
      key,
      jnp.int32(stop_live),
      stop_ids=state.stop_ids,
      steps=engine.segment_steps,
      attention=attention,
      **state.model_static,
    )
    yield
    done, emitted, steps = jax.device_get((state.slots.done, state.slots.emitted, steps))
    since = time.perf_counter()
    state.counts["segments"] += 1
    state.counts["row_steps"] += rows * int(steps)
    state.counts["attention_positions"] += rows * int(steps) * width * z
    state.account(done, np.asarray(emitted, np.int64), before, seg_version, on_group, groups)

  if stats is not None:
    state.report(stats, host_s + time.perf_counter() - since)
  if feed.ring:
    return None
  out = state.out
  return SampledArrays(out.tokens, out.sample_logprobs, out.policy_logprobs, out.lengths)
