"""The paged engine's host-side mirror of its decode slots (`jaxcap.sampling.paged_slots` holds the device side):
which output row each slot decodes, the pages it owns and its page table, as the scheduler
(`jaxcap.sampling.scheduler`) admits, compacts and frees them."""

from __future__ import annotations

import numpy as np

from jaxcap.sampling.page_budget import PromptPages


class HostSlots:
  """The host's mirror of the decode slots: row int [R] (output row, -1 = free), pages (each slot's own page ids),
  table int32 [R, n] (its page table), base int [R] (positions in its prompt's pages), emitted int [R]."""

  def __init__(self, rows: int):
    self.row = np.full(rows, -1, np.int64)
    self.pages: list[list[int]] = [[] for _ in range(rows)]
    self.table = np.zeros((rows, 0), np.int32)
    self.base = np.zeros(rows, np.int64)
    self.emitted = np.zeros(rows, np.int64)

  def place(self, i: int, row: int, prompt: PromptPages, pages: list[int], page_size: int) -> None:
    """Slot `i` starts output row `row` (its token 0 emitted by the prefill) with its own `pages`."""
    self.row[i], self.pages[i] = row, pages
    table = prompt.pages + pages
    if len(table) > self.table.shape[1]:
      self.table = np.pad(self.table, ((0, 0), (0, len(table) - self.table.shape[1])))
    self.table[i] = 0
    self.table[i, : len(table)] = table
    self.base[i], self.emitted[i] = len(prompt.pages) * page_size, 1

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
