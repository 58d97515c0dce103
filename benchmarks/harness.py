"""Shared timing for the CPU benchmarks that race jaxcap against a reference (`transformers`).

How a figure is taken (forward, rollout, train_step, mixed_sizes all go through here):

- each side is warmed up once (jaxcap's first call compiles) and that time is reported apart, never mixed in;
- then the two sides run INTERLEAVED, A B A B ..., for `pairs` pairs, so that a change in machine load or
  clock speed during the run hits both sides alike instead of whichever happened to run second;
- every call is timed on its own; `benchmarks.report` gives min and median per side, and the ratio of the mins
  (jaxcap speed / reference speed), the figure least disturbed by other work;
- the CPU model, core counts, torch's thread count and the 1-minute load average (at start, just before and just
  after the timed section) are printed, plus the CPU time other processes used during the timed section
  (`Section`, reading `benchmarks.machine`); a warning says when the machine was too busy for the figures to be quoted.

Imports only `benchmarks.machine`; `benchmarks.report` prints and writes (`--json`) what is timed here.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from typing import Callable, Sequence

from benchmarks.machine import LOAD_AT_START, busy_seconds, machine_info, machine_lines, own_cpu_seconds

# Quote figures only if the 1-min load average at start is at most this fraction of the usable cores + 1 ...
BUSY_LOAD_FRACTION = 0.75
# ... and other processes used at most this fraction of them, on average, during the timed section.
BUSY_OTHERS_FRACTION = 0.25


def add_arguments(ap) -> None:
  """The flags every benchmark shares: --pairs, --json and --no_ceilings."""
  ap.add_argument("--pairs", type=int, default=5, help="timed (jaxcap, reference) pairs, run interleaved A B A B")
  ap.add_argument("--json", metavar="PATH", help="also write the figures and machine info to PATH as JSON")
  ap.add_argument("--no_ceilings", action="store_true", help="skip measuring the GEMM / bandwidth ceilings")


class Section:
  """The timed section: prints the machine and the load before it, records the load after it and how many cores
  other processes kept busy meanwhile (machine busy CPU time minus this process's, over the wall time).

      with Section() as section:
        times_a, times_b = interleaved(a, b, pairs)
  """

  def __enter__(self) -> Section:
    self.machine = machine_info()
    self.load_before = os.getloadavg()[0]
    self.reasons = []  # why the figures should not be quoted
    cores = self.machine["usable_cores"]
    # The load average counts this process (its model building and compiles) and whatever ran in the last minute,
    # so on its own it cannot say whether others compete; only a start far above the core count is a warning.
    # The deciding figure is the other processes' CPU time measured during the timed section (__exit__).
    if LOAD_AT_START > BUSY_LOAD_FRACTION * cores + 1:
      self.reasons.append(f"1-min load average {LOAD_AT_START:.2f} at start > {BUSY_LOAD_FRACTION} x {cores} + 1")
    for line in machine_lines(self.machine):
      print(line)
    print(f"load average (1 min): {LOAD_AT_START:.2f} at start, {self.load_before:.2f} before timing")
    if self.reasons:
      print(self.warning)
    sys.stdout.flush()
    self._busy0, self._own0, self._t0 = busy_seconds(), own_cpu_seconds(), time.perf_counter()
    return self

  def __exit__(self, *exc) -> None:
    self.wall_s = time.perf_counter() - self._t0
    busy1, own1 = busy_seconds(), own_cpu_seconds()
    self.load_after = os.getloadavg()[0]
    self.other_cores = None
    if self._busy0 is not None and busy1 is not None and self.wall_s > 0:
      self.other_cores = max(0.0, (busy1 - self._busy0) - (own1 - self._own0)) / self.wall_s
      cores = self.machine["usable_cores"]
      if self.other_cores > BUSY_OTHERS_FRACTION * cores:
        self.reasons.append(
          f"other processes kept {self.other_cores:.2f} cores busy during timing > {BUSY_OTHERS_FRACTION} x "
          f"{cores} usable cores"
        )

  @property
  def warning(self) -> str | None:
    if not self.reasons:
      return None
    return "WARNING: figures from a loaded machine: do not quote (" + "; ".join(self.reasons) + ")"


def warm_up(fn: Callable[[], object]) -> float:
  """Seconds of one call (compile included for a first jit call)."""
  t0 = time.perf_counter()
  fn()
  return time.perf_counter() - t0


def interleaved(
  a_fn: Callable[[], object],
  b_fn: Callable[[], object] | None,
  pairs: int,
  repeats: int = 1,
  names: Sequence[str] = ("A", "B"),
) -> tuple[list[float], list[float]]:
  """Times A B A B ... for `pairs` pairs; each turn is `repeats` back-to-back calls of one side, each call timed
  on its own. `b_fn=None` times A alone. Each fn must block until its work is done. Returns (times_a, times_b)
  in seconds per call, in call order. Garbage is collected between turns, outside the timed calls."""
  if pairs < 1 or repeats < 1:
    raise ValueError(f"pairs={pairs}, repeats={repeats}: both must be >= 1")
  times: tuple[list[float], list[float]] = ([], [])
  sides = [(0, a_fn)] + ([(1, b_fn)] if b_fn is not None else [])
  for pair in range(pairs):
    line = []
    for i, fn in sides:
      gc.collect()
      for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times[i].append(time.perf_counter() - t0)
      line.append(f"{names[i]} " + " ".join(f"{t:.3f}" for t in times[i][-repeats:]) + " s")
    print(f"  pair {pair + 1}/{pairs}: " + "   ".join(line), flush=True)
  return times


def cpu_timed(fn: Callable[[], object], into: list) -> Callable[[], None]:
  """`fn`, appending this process's CPU seconds per call (all its threads) to `into`: less moved by other work on a
  shared machine than the wall time, though not immune."""

  def timed():
    t0 = time.process_time()
    fn()
    into.append(time.process_time() - t0)

  return timed
