"""The paged engine's host-side page accounting: the free list, each queued prompt's pages, the pool's size and the
errors a budget too small for a prompt raises. The pool itself (device arrays) is `jaxcap.sampling.paged_cache`.

A prompt of `real` tokens fills ceil(real / Z) pages, left-aligned (`jaxcap.sampling.paged_cache`): floor(real / Z)
full pages its samples share, and a partly filled last one (tail = real % Z tokens) of which each sample gets its
own copy. A sample's own pages are allocated whole at admission for its worst case, ceil((tail + N - 1) / Z) (its
generated tokens but the last, after the tail), so a call never runs out of pages mid-run: a sample waits in the
queue until its pages are free.

A decoder with recurrent layers (Qwen3.5) also keeps each prompt in flight's recurrent states in a store of
`state_rows` rows beside the pages (`StateRows` hands them out), and each decode slot its sample's: fixed bytes per
row (`TextConfig.recurrent_bytes`), whatever the lengths.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from jaxcap.sampling.paged_cache import NULL_PAGE


@dataclasses.dataclass
class PromptPages:
  """A prefilled prompt of `real` tokens in `pages` (left-aligned), `position` the mRoPE position of its last
  token, `remaining` samples not yet finished, `state` its row of the store of prompt states (`StateRows`; 0
  without recurrent layers)."""

  pages: list[int]
  real: int
  position: int
  remaining: int
  state: int = 0

  def shared(self, z: int) -> list[int]:
    """The full pages its G samples read by reference."""
    return self.pages[: self.real // z]

  def tail(self, z: int) -> int | None:
    """Its partly filled last page, which each sample copies (None when the prompt fills its pages)."""
    return self.pages[-1] if self.real % z else None


class PageAllocator:
  """Free page ids 1 .. P - 1 (page 0 is the null page)."""

  def __init__(self, pages: int):
    self.pages = pages
    self.free = list(range(pages - 1, NULL_PAGE, -1))

  def take(self, n: int) -> list[int]:
    return [self.free.pop() for _ in range(n)]

  def give(self, pages: Sequence[int]) -> None:
    self.free.extend(pages)

  def grow(self, pages: int) -> int:
    """Adds the ids of a pool grown to `pages` pages (taken after the free ones); returns `pages`."""
    self.free = list(range(pages - 1, self.pages - 1, -1)) + self.free
    self.pages = pages
    return pages


class StateRows:
  """Free rows 0 .. S - 1 of the store of prompt states (`paged_cache.PagePool.states`)."""

  def __init__(self, rows: int):
    self.rows = rows
    self.free = list(range(rows - 1, -1, -1))

  def take(self) -> int:
    return self.free.pop()

  def give(self, row: int) -> None:
    self.free.append(row)

  def grow(self, rows: int) -> int:
    """Adds the rows of a store grown to `rows` (taken after the free ones); returns `rows`."""
    self.free = list(range(rows - 1, self.rows - 1, -1)) + self.free
    self.rows = rows
    return rows


def state_rows(slots: int, blocks) -> int:
  """Rows of the store of prompt states an engine of `slots` decode slots needs for chunks of `blocks` prompts
  each: the scheduler prefills a chunk only while its queue holds fewer samples than there are free slots, so
  before a prefill every prompt in flight has a sample decoding (at most slots - free) or queued (fewer than free
  samples): at most slots - 1 prompts, and a chunk adds at most its block."""
  return slots + max(blocks, default=0)


def prompt_tokens(attention_mask: np.ndarray, rows: int) -> np.ndarray:
  """Each real prompt's tokens, int [rows] (attention_mask [B, T])."""
  return np.asarray(attention_mask)[:rows].sum(-1).astype(np.int64)


def prompt_pages(real, z: int):
  """Pages of `z` tokens a prompt of `real` tokens fills: ceil(real / z) (int or int array)."""
  return -(-real // z)


def own_pages(max_new_tokens: int, z: int, tail=0):
  """A sample's own pages: its copy of its prompt's last page (`tail` tokens filled, 0 = none) and its generated
  tokens but the last (which is emitted, never fed back): ceil((tail + max_new_tokens - 1) / z)."""
  return -(-(tail + max_new_tokens - 1) // z)


def pool_pages(chunk_real: Sequence[np.ndarray], *, slots: int, pages: int, z: int, max_new_tokens: int) -> int:
  """The pool's page count for chunks of prompts of chunk_real[c] int [rows] tokens: `pages` (rollout.pages)
  checked against every prompt, or, with 0, enough for every slot at its worst (its prompt's pages and its own)
  plus one chunk's prompts at once."""
  if pages:
    for c, real in enumerate(chunk_real):
      for b, t in enumerate(real):
        p, own = int(prompt_pages(t, z)), int(own_pages(max_new_tokens, z, t % z))
        if p + own > pages - 1:
          raise ValueError(
            f"prompt {b} of chunk {c} needs {p} pages of {z} tokens plus {own} for its "
            f"max_new_tokens={max_new_tokens}, more than rollout.pages={pages} minus the null page; raise "
            f"rollout.pages (or rollout.page_size), or lower sampling.max_new_tokens"
          )
    return pages
  worst = max(
    (int((prompt_pages(r, z) + own_pages(max_new_tokens, z, r % z)).max()) for r in chunk_real if r.size), default=0
  )
  biggest_chunk = max((int(prompt_pages(r, z).sum()) for r in chunk_real), default=0)
  return 1 + slots * worst + biggest_chunk


def chunk_too_big(chunk: int, prompt_pages_: int, own: int, pool: int) -> ValueError:
  """The error of a pool (rollout.pages) too small for a chunk's prompts plus one sample's own pages."""
  return ValueError(
    f"chunk {chunk} needs {prompt_pages_} pages for its prompts plus {own} for a sample, more than "
    f"rollout.pages={pool} holds; raise rollout.pages or use smaller chunks"
  )


def no_sample_fits(free: int, pool: int, own: int, max_new_tokens: int) -> ValueError:
  """The error of a pool whose free pages cannot take one more sample's own pages while nothing decodes."""
  return ValueError(
    f"no sample fits: {free} free pages of rollout.pages={pool}, {own} needed for one sample's "
    f"max_new_tokens={max_new_tokens}; raise rollout.pages or lower sampling.max_new_tokens"
  )
