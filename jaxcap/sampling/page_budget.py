"""The paged engine's host-side page accounting: the free list, each queued prompt's pages, the pool's size and the
errors a budget too small for a prompt raises. The pool itself (device arrays) is `jaxcap.sampling.paged_cache`.

Pages are allocated whole at admission (a sample's own pages for its worst case, ceil((N - 1) / Z)), so a call
never runs out of pages mid-run: a sample waits in the queue until its pages are free.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from jaxcap.sampling.paged_cache import NULL_PAGE


@dataclasses.dataclass
class PromptPages:
  """A prefilled prompt: its pages (shared by reference by its G samples), `start` its left padding in the first
  page, `position` the mRoPE position of its last token, `remaining` samples not yet finished."""

  pages: list[int]
  start: int
  position: int
  remaining: int


class PageAllocator:
  """Free page ids 1 .. P - 1 (page 0 is the null page)."""

  def __init__(self, pages: int):
    self.free = list(range(pages - 1, NULL_PAGE, -1))

  def take(self, n: int) -> list[int]:
    return [self.free.pop() for _ in range(n)]

  def give(self, pages: Sequence[int]) -> None:
    self.free.extend(pages)


def prompt_pages(attention_mask: np.ndarray, rows: int, z: int) -> np.ndarray:
  """Pages of `z` tokens each real prompt fills: ceil(real tokens / z), int [rows] (attention_mask [B, T])."""
  real = np.asarray(attention_mask)[:rows].sum(-1)
  return -(-real // z)


def own_pages(max_new_tokens: int, z: int) -> int:
  """A sample's own pages: its generated tokens but the last (which is emitted, never fed back)."""
  return math.ceil((max_new_tokens - 1) / z)


def pool_pages(chunk_pages: Sequence[np.ndarray], *, slots: int, pages: int, z: int, max_new_tokens: int) -> int:
  """The pool's page count: `pages` (rollout.pages) checked against every prompt, or, with 0, enough for every slot
  at its worst (its prompt's pages and its own) plus one chunk's prompts at once."""
  own = own_pages(max_new_tokens, z)
  if pages:
    for c, pp in enumerate(chunk_pages):
      for b, p in enumerate(pp):
        if p + own > pages - 1:
          raise ValueError(
            f"prompt {b} of chunk {c} needs {p} pages of {z} tokens plus {own} for its "
            f"max_new_tokens={max_new_tokens}, more than rollout.pages={pages} minus the null page; raise "
            f"rollout.pages (or rollout.page_size), or lower sampling.max_new_tokens"
          )
    return pages
  most = max((int(p.max()) for p in chunk_pages if p.size), default=0)
  biggest_chunk = max((int(p.sum()) for p in chunk_pages), default=0)
  return 1 + slots * (own + most) + biggest_chunk
