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
  available()       the chunks at hand now (the pool is sized for them; a stream grows it as chunks arrive)
  chunk(c)          chunk c (a host `SamplerBatch`; a stream may wait for it)
  weights(oldest)   (params, version) the programs run with while chunk `oldest` is the oldest unfinished one
  finished(c, arrays, versions)   chunk c is done: its `SampledArrays` rows and versions int32 [rows, N]
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

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
