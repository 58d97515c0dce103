"""Which micro-batch and row each of a step's packed sequences takes (host side, pure Python over lengths), for
`jaxcap.train.packing.rows`.

A step's sequences are N = Np * G: sequence n is completion n of prompt n // G. Each prompt's G sequences go to one
micro-batch where they fit (first-fit decreasing over prompts by tokens, so each micro-batch embeds its prompts'
images once); within a micro-batch, sequences go to rows by first-fit decreasing. Rows are `row_len` tokens (a
`jaxcap.buckets.ladder` size from the longest sequence's up to the budget: the one computing the fewest slots).
"""

from __future__ import annotations

from typing import Sequence

from jaxcap.buckets import DEFAULT_STEPS, ladder


def fill_rows(lengths: Sequence[int], row_len: int, rows: int, free: list[int] | None = None) -> list[int] | None:
  """First-fit of `lengths` (in the given order) into `rows` rows of `row_len` with `free` slots each (default all):
  each length's row, or None if one does not fit. Updates `free` in place only on success."""
  free_now = list(free) if free is not None else [row_len] * rows
  where = []
  for n in lengths:
    r = next((i for i, f in enumerate(free_now) if f >= n), None)
    if r is None:
      return None
    free_now[r] -= n
    where.append(r)
  if free is not None:
    free[:] = free_now
  return where


def units(prompt_lens: Sequence[int], completion_lens: Sequence[int], group: int, row_len: int, share: bool):
  """The items rows hold: (prompt, its sequences, tokens). Without `share`, each (prompt, completion) sequence
  alone; with it, a prompt once followed by as many of its completions as fit `row_len` (first-fit decreasing, so a
  group longer than a row is split over units, each with its own copy of the prompt)."""
  out = []
  for p in range(len(prompt_lens)):
    seqs = sorted(range(p * group, (p + 1) * group), key=lambda n: -int(completion_lens[n]))
    if not share:
      out.extend((p, (n,), int(prompt_lens[p]) + int(completion_lens[n])) for n in sorted(seqs))
      continue
    bins: list[list[int]] = []
    free: list[int] = []
    for n in seqs:
      c = int(completion_lens[n])
      b = next((i for i, f in enumerate(free) if f >= c), None)
      if b is None:
        bins.append([])
        free.append(row_len - int(prompt_lens[p]))
        b = len(bins) - 1
      bins[b].append(n)
      free[b] -= c
    out.extend((p, tuple(sorted(b)), row_len - f) for b, f in zip(bins, free))
  return out


def assign(
  prompt_lens: Sequence[int],
  completion_lens: Sequence[int],
  group: int,
  budget: int,
  steps: int = DEFAULT_STEPS,
  share: bool = False,
):
  """Sequences -> micro-batches and rows. prompt_lens [Np], completion_lens [N = Np * group] (tokens).
  Returns (row_len, rows per micro-batch, micro-batches: lists of (unit, row) in row-fill order), a unit being a
  tuple of one prompt's sequences laid out as that prompt once and their completions (`units`; without `share`,
  one sequence).

  The row length is the ladder size, from the longest sequence's up to the budget, whose packing computes the
  fewest token slots (micro-batches x rows used x row length, each count up the ladder as
  `jaxcap.train.packing.rows.pack` compiles them; ties: the shorter rows, whose attention is cheaper): rows as long as
  the longest sequence hold one sequence each when every sequence is a little over half of it."""
  seq_lens = [int(prompt_lens[n // group]) + int(completion_lens[n]) for n in range(len(completion_lens))]
  longest = max(seq_lens, default=1)
  if longest > budget:
    raise ValueError(
      f"a sequence of {longest} tokens does not fit rl.micro_batch_tokens={budget}; raise it to at least {longest}"
    )
  best = None
  row_len = min(ladder(longest, 8, steps), budget)
  while True:
    rows = max(1, budget // row_len)
    items = units(prompt_lens, completion_lens, group, row_len, share)
    micros = _assign_rows(items, row_len, rows)
    used = ladder(max(r for mb in micros for _, r in mb) + 1, 1, steps)
    slots = ladder(len(micros), 1, steps) * used * row_len
    if best is None or slots < best[0]:
      best = (slots, row_len, rows, micros)
    if row_len >= budget:
      break
    row_len = min(ladder(row_len + 1, 8, steps), budget)
  return best[1:]


def _assign_rows(items: list, row_len: int, rows: int):
  """First-fit decreasing of each prompt's units (`units`: (prompt, sequences, tokens)) into micro-batches of `rows` rows
  of `row_len`: a prompt's units in one micro-batch where they fit (its images embedded once)."""
  by_prompt: dict[int, list] = {}
  for prompt, seqs, tokens in items:
    by_prompt.setdefault(prompt, []).append((seqs, tokens))
  order = lambda us: sorted(us, key=lambda u: -u[1])
  groups = sorted(by_prompt.values(), key=lambda us: -sum(u[1] for u in us))
  micros: list[tuple[list[int], list]] = []  # (free per row, [(unit, row)])
  for group in groups:
    us = order(group)
    for free, placed in micros:
      where = fill_rows([u[1] for u in us], row_len, rows, free)
      if where is not None:
        placed.extend((u[0], r) for u, r in zip(us, where))
        break
    else:  # a fresh micro-batch, split over several if the group does not fit one
      while us:
        free, placed = [row_len] * rows, []
        rest = []
        for u in us:
          where = fill_rows([u[1]], row_len, rows, free)
          (rest.append(u) if where is None else placed.append((u[0], where[0])))
        micros.append((free, placed))
        us = rest
  return [placed for _, placed in micros]
