"""The paged engine's host mirror of its decode slots (`HostSlots`): which sample each slot holds, its own pages and
page table, how far it has got; and the row buckets the slots are compiled at. The device state is
`jaxcap.sampling.paged_slots.Slots`; the host scheduler (`jaxcap.sampling.scheduler`) keeps the two in step.
"""

from __future__ import annotations

import numpy as np

from jaxcap.buckets import ladder
from jaxcap.sampling.page_budget import PromptPages

REFILL_FRACTION = 8  # a segment returns to refill once 1/8 of the slots (at least one) have finished
BUCKET_STEPS = 2  # sizes per octave of the row and page buckets


def row_bucket(live: int, slots: int) -> int:
  """The compiled row count for `live` slots: the next ladder size, at most `slots`."""
  return min(ladder(max(1, live), 1, BUCKET_STEPS), slots)


def smaller_bucket(rows: int) -> int:
  """The largest ladder size below `rows` (0 for rows <= 1): a draining segment returns once that many are live."""
  b = rows - 1
  while b > 0 and ladder(b, 1, BUCKET_STEPS) >= rows:
    b -= 1
  return b


class HostSlots:
  """The host's mirror of the decode slots: row int [R] (output row, -1 = free), pages (each slot's own page ids),
  table int32 [R, n] (its page table: its prompt's full pages, then its own), base int [R] (its prompt's tokens:
  positions filled when it was admitted), emitted int [R]."""

  def __init__(self, rows: int):
    self.row = np.full(rows, -1, np.int64)
    self.pages: list[list[int]] = [[] for _ in range(rows)]
    self.table = np.zeros((rows, 0), np.int32)
    self.base = np.zeros(rows, np.int64)
    self.emitted = np.zeros(rows, np.int64)

  def place(self, i: int, row: int, prompt: PromptPages, pages: list[int], page_size: int) -> int | None:
    """Slot `i` starts output row `row` (its token 0 emitted by the prefill) with its own `pages`. Returns the
    prompt's partly filled last page, which the slot's first own page must be a copy of (None: the prompt fills
    its pages)."""
    self.row[i], self.pages[i] = row, pages
    table = prompt.shared(page_size) + pages
    if len(table) > self.table.shape[1]:
      self.table = np.pad(self.table, ((0, 0), (0, len(table) - self.table.shape[1])))
    self.table[i] = 0
    self.table[i, : len(table)] = table
    self.base[i], self.emitted[i] = prompt.real, 1
    return prompt.tail(page_size)

  def take(self, index: np.ndarray) -> None:
    """Keeps the slots `index` int [R'] names (-1 = an empty slot), in that order."""
    keep = (index >= 0).reshape(-1, 1)
    pick = lambda a, fill: np.where(keep.reshape(-1, *([1] * (a.ndim - 1))), a[np.maximum(index, 0)], fill)
    self.row, self.table = pick(self.row, -1), pick(self.table, 0)
    self.base, self.emitted = pick(self.base, 0), pick(self.emitted, 0)
    self.pages = [self.pages[k] if k >= 0 else [] for k in index]

  def reach(self, steps: int) -> int:
    """Cache positions the live slots can fill within `steps` more steps (their longest)."""
    return int(np.where(self.row >= 0, self.base + self.emitted - 1 + steps, 0).max())
