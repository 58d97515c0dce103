"""The paged engine's state on one device between decode segments (`EngineState`) and the steps the host scheduler
(`jaxcap.sampling.scheduler.shard`, which runs the loop and the decode segments) takes on it: prefill the next
chunk of prompts, admit queued samples into free slots, compact the live slots into a smaller row bucket, account
a finished segment (free its finished samples' pages, hand over finished prompts and chunks).
"""

from __future__ import annotations

import collections
import jax
import jax.numpy as jnp
import numpy as np

from jaxcap.sampling import paged_slots
from jaxcap.sampling import paged_decode as programs
from jaxcap.sampling.chunk_feed import ChunkBook, TokenVersions
from jaxcap.sampling.host_slots import HostSlots, row_bucket
from jaxcap.sampling.page_budget import PageAllocator, PromptPages, StateRows, chunk_too_big, no_sample_fits
from jaxcap.sampling.page_budget import own_pages, state_rows
from jaxcap.sampling.paged_cache import NULL_PAGE, PagePool, grow_pool, grow_states, recurrent_zeros
from jaxcap.sampling.prompts import pad_length
from jaxcap.sampling.rollouts import SampledArrays


class EngineState:
  """One `shard`'s host and device state. Host: the chunks' record (`book`), the page allocator (`alloc`, of
  `total_pages` pages), the store of prompt states (`stored`: rows of a hybrid decoder's recurrent states, one per
  prompt in flight), the prompts in flight (`prompts`: PromptPages by prompt number), the queue of samples
  ((prompt, sample) pairs, prompt-major), the chunks not yet prefilled (`pending`), the decode slots' mirror
  (`host`, `rows` compiled rows) and `counts` (segments, compactions, ...: `shard`'s stats). Device: the page pool
  (`pool`), the outputs (`out`, `out_rows` rows) and the decode slots (`slots`). `current` / `version` / `weights`:
  the params the programs run with, their version and their decode layout. Keywords as `shard`'s."""

  def __init__(self, feed, key, *, graphdef, cfg, engine, sampling, num_samples, pad_id, max_lengths, numbers, embed):
    self.feed, self.key, self.graphdef, self.engine = feed, key, graphdef, engine
    self.pad_id, self.embed = pad_id, embed
    self.g, self.n_new, self.z = num_samples, sampling.max_new_tokens, engine.page_size
    self.stop_ids = sampling.resolve_stop_ids(cfg.eos_token_id)
    self.book = book = ChunkBook(feed, self.g, self.z, self.n_new)
    self.out_rows, self.out_row = book.out_rows, book.out_row
    self.numbers = np.arange(book.offsets[-1]) if numbers is None else np.asarray(numbers)
    self.total_pages = book.pool_pages(engine)
    # a decoder with recurrent layers: each prompt in flight's states in a row of the pool's store, each slot's own
    self.recurrent = bool(recurrent_zeros(cfg, 0))
    self.stored = StateRows(state_rows(engine.slots, feed.blocks) if self.recurrent else 0)
    self.pool = PagePool.for_model(cfg, self.total_pages, self.z, self.stored.rows)
    self.alloc = PageAllocator(self.total_pages)
    self.out = paged_slots.Outputs.empty(self.out_rows, self.n_new, pad_id)
    # each output row's cap on emitted tokens, int [sum of blocks * G]
    n_rows = int(book.offsets[-1]) * self.g
    self.limits = np.full(n_rows, self.n_new, np.int64) if max_lengths is None else np.minimum(max_lengths, self.n_new)
    self.model_static = dict(graphdef=graphdef, sampling=sampling, num_samples=self.g)
    self.current, self.version = feed.weights(0)
    self.weights = programs.SegmentWeights(self.current, graphdef)
    self.versions = TokenVersions(self.out_rows, self.n_new) if feed.ring else None
    self.rows = engine.slots
    self.slots = paged_slots.Slots.empty(self.rows, self.out_rows, recurrent_zeros(cfg, self.rows))
    self.host = HostSlots(self.rows)
    self.prompts: dict[int, PromptPages] = {}
    self.queue: collections.deque = collections.deque()
    self.pending = collections.deque(range(book.count))
    self.counts = collections.Counter()

  def own(self, prompt: int) -> int:
    """A queued sample of `prompt`'s own pages."""
    return int(own_pages(self.n_new, self.z, self.prompts[prompt].real % self.z))

  def free_slots(self) -> list[int]:
    return [i for i in range(self.rows) if self.host.row[i] < 0]

  def live(self) -> int:
    """Slots decoding a sample."""
    return int((self.host.row >= 0).sum())

  def all_finished(self) -> bool:
    """Whether every sample has finished (nothing live, queued or to prefill)."""
    return self.live() == 0 and not self.queue and not self.pending

  def use_weights(self) -> None:
    """The params of the oldest unfinished chunk (a stream's weights change when it does)."""
    params, v = self.feed.weights(min(self.book.oldest(), self.book.count - 1))
    if params is not self.current:
      self.current, self.version = params, v
      self.weights = programs.SegmentWeights(params, self.graphdef)

  def can_prefill(self) -> bool:
    """Whether the next chunk may enter now and its prompts' pages plus a sample's own are free."""
    book = self.book
    if not self.pending or not book.admits(self.pending[0]):
      return False
    c = self.pending[0]
    if c not in book.real:  # a stream's next chunk: the pool grows to hold it beside the chunk before
      book.at_hand(c, self.feed.chunk(c))
      need = book.pool_pages(self.engine, [k for k in (c - 1, c) if k in book.real])
      if need > self.total_pages:
        self.pool, self.total_pages = grow_pool(self.pool, need), self.alloc.grow(need)
    return len(self.alloc.free) >= int(book.pages[c].sum()) + book.own[c]

  def prefill(self, free: int) -> None:
    """Prefills chunks while the queue holds fewer samples than the `free` slots and the next chunk fits."""
    while self.pending and len(self.queue) < free and self.can_prefill():
      self.prefill_next()

  def prefill_next(self) -> None:
    """Runs the next chunk's prompts into their pages (and state rows) and queues their G samples each."""
    book, g, z = self.book, self.g, self.z
    c = self.pending.popleft()
    chunk = self.feed.chunk(c)
    padded = pad_length(chunk.prompts, -(-chunk.prompts.length // z) * z, self.pad_id)
    page_ids = np.zeros((chunk.block, padded.length // z), np.int32)
    real = np.asarray(padded.attention_mask).sum(-1)
    deltas = np.asarray(padded.rope_deltas)
    stored = self.stored
    if self.recurrent and len(stored.free) < chunk.rows:  # beyond `state_rows`' bound: never, but grown, not failed
      self.pool = grow_states(self.pool, stored.grow(stored.rows + chunk.rows - len(stored.free)))
    state_ids = np.full(chunk.block, stored.rows, np.int32)  # past the store: a padded prompt's, dropped
    for b in range(chunk.rows):
      pages = self.alloc.take(int(book.pages[c][b]))
      page_ids[b, : len(pages)] = pages
      prompt = int(book.offsets[c]) + b
      state = stored.take() if self.recurrent else 0
      state_ids[b] = state
      self.prompts[prompt] = PromptPages(pages, int(real[b]), int(real[b] + deltas[b]) - 1, g, state)
      self.queue.extend((prompt, s) for s in range(g))
    self.use_weights()
    first = self.out_row(int(book.offsets[c]) * g) // g
    self.pool, self.out = programs.prefill_jit(
      self.current,
      jax.tree.map(jnp.asarray, padded),
      self.pool,
      self.out,
      jnp.asarray(page_ids),
      jnp.int32(first),
      jnp.int32(chunk.rows),
      self.key,
      jnp.int32(self.numbers[book.offsets[c]]),
      self.embed(c),
      jnp.asarray(state_ids) if self.recurrent else None,
      **self.model_static,
    )
    book.left[c] = chunk.rows * g
    if self.versions is not None:
      self.versions.prefilled(np.arange(first * g, (first + chunk.rows) * g), self.version)
    if book.left[c] == 0:
      self.finish(c)

  def too_small_for_chunk(self) -> ValueError:
    """The error of a pool too small for the next chunk's prompts at once while nothing decodes."""
    c = self.pending[0]
    return chunk_too_big(c, int(self.book.pages[c].sum()), self.book.own[c], self.total_pages)

  def too_small_for_sample(self) -> ValueError:
    """The error of a pool whose free pages cannot take the next queued sample while nothing decodes."""
    return no_sample_fits(len(self.alloc.free), self.total_pages, self.own(self.queue[0][0]), self.n_new)

  def admit(self, free: list[int]) -> None:
    """Queued samples take the `free` slots (in order) while their own pages are free."""
    g, host = self.g, self.host
    admitted = np.zeros((9, self.rows), np.int64)
    admitted[0], admitted[7] = self.rows, self.total_pages  # slot index rows = no one; copy to page P = no copy
    j = 0
    while self.queue and free and len(self.alloc.free) >= self.own(self.queue[0][0]):
      prompt, s = self.queue.popleft()
      i, row, p = free.pop(0), prompt * g + s, self.prompts[prompt]
      pages = self.alloc.take(self.own(prompt))
      tail = host.place(i, row, p, pages, self.z)  # copied into its first own page
      copy = (NULL_PAGE, self.total_pages) if tail is None else (tail, pages[0])
      # its prompt's recurrent states copied over the slot's (a refilled slot keeps nothing of its last sample)
      s_key = self.numbers[prompt] * g + s
      admitted[:, j] = (i, self.out_row(row), s_key, self.limits[row], host.base[i], p.position, *copy, p.state)
      j += 1
    if j:
      admit = (jnp.asarray(x, jnp.int32) for x in admitted)
      self.slots, self.pool = paged_slots.admit_jit(self.slots, self.out, self.pool, *admit, stop_ids=self.stop_ids)

  def compact(self, live: int) -> None:
    """Moves the `live` slots into the smallest row bucket that holds them."""
    keep = np.flatnonzero(self.host.row >= 0)
    self.rows = row_bucket(live, self.engine.slots)
    index = np.full(self.rows, -1, np.int64)
    index[: len(keep)] = keep
    self.slots = paged_slots.compact_jit(self.slots, jnp.asarray(index, jnp.int32), out_rows=self.out_rows)
    self.host.take(index)
    self.counts["compactions"] += 1

  def account(self, done: np.ndarray, emitted: np.ndarray, before: np.ndarray, version: int, on_group, groups):
    """After a segment run under `version`: slots' done bool [R] and emitted int [R] (`before` it: int [R]).
    Finished samples free their own pages, a prompt whose samples have all finished its pages and state row
    (`on_group` then called with its samples, numbered `groups`), a chunk whose samples have all finished is
    handed back (`finish`)."""
    book, host, g = self.book, self.host, self.g
    if self.versions is not None:
      busy = np.flatnonzero(host.row >= 0)
      self.versions.decoded(self.out_row(host.row[busy]), before[busy], emitted[busy], version)
    complete, finished_chunks = [], []
    for i in np.flatnonzero((host.row >= 0) & done):
      prompt = int(host.row[i]) // g
      self.alloc.give(host.pages[i])
      host.pages[i], host.row[i] = [], -1
      p = self.prompts[prompt]
      p.remaining -= 1
      c = book.chunk_of(prompt)
      book.left[c] -= 1
      if book.left[c] == 0:
        finished_chunks.append(c)
      if p.remaining == 0:
        self.alloc.give(p.pages)
        if self.recurrent:
          self.stored.give(p.state)
        del self.prompts[prompt]
        complete.append(prompt)
    host.emitted = emitted
    if on_group is not None and complete:
      paged_slots.hand_over(on_group, self.out, complete, g, groups, self.out_row)
    for c in finished_chunks:
      self.finish(c)

  def finish(self, c: int) -> None:
    """A stream's chunk c is done: handed back, its output rows cleared for reuse (nothing for an eager feed)."""
    if self.feed.ring is None:
      return
    lo, n = self.out_row(int(self.book.offsets[c]) * self.g), int(self.feed.blocks[c]) * self.g
    out, span = self.out, slice(lo, lo + n)
    part = SampledArrays(out.tokens[span], out.sample_logprobs[span], out.policy_logprobs[span], out.lengths[span])
    self.feed.finished(c, part, self.versions.take(span))
    self.out = paged_slots.clear_rows_jit(out, jnp.int32(lo), rows=n, pad_id=self.pad_id)

  def report(self, stats: dict, host_s: float) -> None:
    """Fills `stats` with the counts, `host_s`, the pool's pages and state rows (with those free), trace counts."""
    stats.update(self.counts, host_s=host_s, pages=self.total_pages, free_pages=len(self.alloc.free))
    stats.update(state_rows=self.stored.rows, free_state_rows=len(self.stored.free))
    stats["traces"] = dict(paged_slots.TRACE_COUNTS)
