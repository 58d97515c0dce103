"""Where the paged engine's chunks of prompts and its weights come from (`scheduler.shard`'s `feed`).

  EagerFeed     a call's chunks, all at hand, and one set of weights (every sampler call)
  a stream      partial rollouts (`jaxcap.train.rollouts.partial.RoundFeed`): chunks handed over as the loop draws
                them, weights that change when a chunk finishes, output rows reused (`ring`), each finished chunk
                handed back (`finished`) with the weights version of each of its tokens

A feed says:
  blocks            int per chunk: its block of prompts (known up front: the output's numbering)
  ring              None (every prompt its own output rows), or the prompts' rows a stream reuses: prompt p's rows
                    are those of p % ring (its chunk's must have been handed back before)
  ahead             None, or the most chunks prefilled beyond the oldest unfinished one
  oldest()          (optional) the oldest unfinished chunk, when several devices' engines share the stream
  available()       the chunks at hand now (the pool is sized for them; a stream grows it as chunks arrive)
  chunk(c)          chunk c (a host `SamplerBatch`; a stream may wait for it)
  weights(oldest)   (params, version) the programs run with while chunk `oldest` is the oldest unfinished one
  finished(c, arrays, versions)   chunk c is done: its `SampledArrays` rows and versions int32 [rows, N]
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from jaxcap.sampling.page_budget import own_pages, pool_pages, prompt_pages, prompt_tokens
from jaxcap.sampling.placement import SamplerBatch


class EagerFeed:
  """`chunks`, all at hand, sampled with `params` (version 0)."""

  ring = None
  ahead = None

  def __init__(self, params, chunks: Sequence[SamplerBatch]):
    self.params, self.chunks = params, list(chunks)
    self.blocks = [c.block for c in self.chunks]

  def available(self) -> list[SamplerBatch]:
    return self.chunks

  def chunk(self, c: int) -> SamplerBatch:
    return self.chunks[c]

  def weights(self, oldest: int) -> tuple[Any, int]:
    return self.params, 0

  def finished(self, c: int, arrays, versions) -> None:
    pass


class ChunkBook:
  """The engine's host record of a feed's chunks: offsets int [C + 1] (chunk c's prompts are offsets[c] ..
  offsets[c + 1] - 1), each chunk's prompts' tokens (`real`), pages and a sample's most own pages once at hand,
  its samples not finished (`left`, -1 before its prefill), and where a global output row lies in the outputs
  (`out_row`: a stream's rows are reused)."""

  def __init__(self, feed, num_samples: int, page_size: int, max_new_tokens: int):
    self.feed, self.g, self.z, self.n_new = feed, num_samples, page_size, max_new_tokens
    self.offsets = np.cumsum([0] + list(feed.blocks))
    self.count = len(feed.blocks)
    self.out_rows = int(feed.ring or self.offsets[-1]) * num_samples
    self.real: dict[int, np.ndarray] = {}
    self.pages: dict[int, np.ndarray] = {}
    self.own: dict[int, int] = {}
    self.left = [-1] * self.count
    for c, chunk in enumerate(feed.available()):
      self.at_hand(c, chunk)

  def out_row(self, row):
    return row % self.out_rows if self.feed.ring else row

  def at_hand(self, c: int, chunk: SamplerBatch) -> SamplerBatch:
    if c not in self.real:
      self.real[c] = prompt_tokens(chunk.prompts.attention_mask, chunk.rows)
      self.pages[c] = prompt_pages(self.real[c], self.z)
      self.own[c] = int(own_pages(self.n_new, self.z, self.real[c] % self.z).max(initial=0))  # its prompts' most
    return chunk

  def pool_pages(self, engine, chunks=None) -> int:
    """The pool's pages for `chunks` (default: every chunk at hand); a stream's pool also holds the prompts of
    the chunk before beside them (two chunks decode at once)."""
    chunks = sorted(self.real) if chunks is None else chunks
    n = pool_pages([self.real[c] for c in chunks], slots=engine.slots, pages=engine.pages, z=self.z,
                   max_new_tokens=self.n_new)  # fmt: skip
    return n + (int(self.pages[chunks[-1]].sum()) if self.feed.ring and not engine.pages and chunks else 0)

  def oldest(self) -> int:
    """The oldest chunk with samples not finished (`count` once all have); a feed shared by several devices' engines
    says it for all of them (`feed.oldest()`: a chunk is finished once every device has finished its block)."""
    shared = getattr(self.feed, "oldest", None)
    return shared() if shared is not None else next((c for c in range(self.count) if self.left[c] != 0), self.count)

  def admits(self, c: int) -> bool:
    """Whether chunk c may enter now (a stream's: only once every chunk before c - feed.ahead has finished)."""
    return self.feed.ahead is None or c <= self.oldest() + self.feed.ahead

  def chunk_of(self, prompt: int) -> int:
    return int(np.searchsorted(self.offsets, prompt, side="right")) - 1


class TokenVersions:
  """The weights version of every output token (a stream's record; host int32 [rows, N], -1 = none yet)."""

  def __init__(self, rows: int, max_new_tokens: int):
    self.table = np.full((rows, max_new_tokens), -1, np.int32)

  def prefilled(self, rows: np.ndarray, version: int) -> None:
    self.table[rows, 0] = version

  def decoded(self, rows: np.ndarray, before: np.ndarray, after: np.ndarray, version: int) -> None:
    """Rows `rows` emitted tokens [before, after) under `version`."""
    for r, lo, hi in zip(rows, before, after):
      self.table[r, lo:hi] = version

  def take(self, rows: slice) -> np.ndarray:
    out = self.table[rows].copy()
    self.table[rows] = -1
    return out
