"""Shared timing and reporting for the CPU benchmarks that race jaxcap against a reference (`transformers`).

How a figure is taken (forward, rollout, train_step, mixed_sizes all go through here):

- each side is warmed up once (jaxcap's first call compiles) and that time is reported apart, never mixed in;
- then the two sides run INTERLEAVED, A B A B ..., for `pairs` pairs, so that a change in machine load or
  clock speed during the run hits both sides alike instead of whichever happened to run second;
- every call is timed on its own; the report gives min and median per side, and the ratio of the mins
  (jaxcap speed / reference speed), the figure least disturbed by other work;
- the CPU model, core counts, torch's thread count and the 1-minute load average (at start, just before and just
  after the timed section) are printed, plus the CPU time other processes used during the timed section; a
  warning says when the machine was too busy for the figures to be quoted.

`--json PATH` writes all of it (every call's time too), so README tables can be regenerated from files.

This module imports nothing of benchmarks/: `benchmarks.ceilings` measures the ceilings on top of it, and `report`
only prints the ceilings record it is handed (`fractions`, `print_ceilings` below).
"""

from __future__ import annotations

import datetime
import gc
import json
import os
import platform
import resource
import statistics
import sys
import time
from typing import Callable, Sequence

# Taken when the benchmark script starts (it imports this module before any heavy work), so it shows the load
# other processes put on the machine, before this process adds its own.
LOAD_AT_START = os.getloadavg()[0]
# Quote figures only if the 1-min load average at start is at most this fraction of the usable cores + 1 ...
BUSY_LOAD_FRACTION = 0.75
# ... and other processes used at most this fraction of them, on average, during the timed section.
BUSY_OTHERS_FRACTION = 0.25


def add_arguments(ap) -> None:
  """The flags every benchmark shares: --pairs, --json and --no_ceilings."""
  ap.add_argument("--pairs", type=int, default=5, help="timed (jaxcap, reference) pairs, run interleaved A B A B")
  ap.add_argument("--json", metavar="PATH", help="also write the figures and machine info to PATH as JSON")
  ap.add_argument("--no_ceilings", action="store_true", help="skip measuring the GEMM / bandwidth ceilings")


def usable_cores() -> int:
  """Cores this process may run on (its CPU affinity), which can be fewer than `os.cpu_count()`."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not Linux
    return os.cpu_count() or 1


def cpu_model() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine() or "unknown"


def _cpu_quota() -> str | None:
  """The cgroup v2 CPU limit ("quota period" in microseconds), if one is set."""
  try:
    with open("/sys/fs/cgroup/cpu.max") as f:
      quota = f.read().strip()
  except OSError:
    return None
  return None if quota.startswith("max") else quota


def machine_info() -> dict:
  """CPU model, core counts, thread settings and library versions (of those already imported)."""
  info = dict(
    cpu_model=cpu_model(),
    cpu_count=os.cpu_count(),
    usable_cores=usable_cores(),
    cgroup_cpu_max=_cpu_quota(),
    python=platform.python_version(),
    omp_wait_policy=os.environ.get("OMP_WAIT_POLICY"),
    omp_num_threads=os.environ.get("OMP_NUM_THREADS"),
    xla_flags=os.environ.get("XLA_FLAGS"),
    glibc_tunables=os.environ.get("GLIBC_TUNABLES"),  # jaxcap.host_memory: freed XLA buffers kept or unmapped
  )
  torch = sys.modules.get("torch")
  if torch is not None:
    info["torch"] = torch.__version__
    info["torch_threads"] = torch.get_num_threads()
  for name in ("transformers", "jax"):
    mod = sys.modules.get(name)
    if mod is not None:
      info[name] = mod.__version__
  if "jax" in sys.modules:
    info["jax_platform"] = sys.modules["jax"].devices()[0].platform
  return info


def _machine_lines(info: dict) -> list[str]:
  env = ", ".join(f"{k}={info[k.lower()]}" for k in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS") if info[k.lower()])
  return [
    f"machine: {info['cpu_model']}; os.cpu_count()={info['cpu_count']}, usable cores (affinity)="
    f"{info['usable_cores']}" + (f", cgroup cpu.max={info['cgroup_cpu_max']}" if info["cgroup_cpu_max"] else ""),
    f"software: torch {info.get('torch', '-')} ({info.get('torch_threads', '-')} threads), transformers "
    f"{info.get('transformers', '-')}, jax {info.get('jax', '-')} on {info.get('jax_platform', '-')}, python "
    f"{info['python']}" + (f"; {env}" if env else ""),
    "host malloc: "
    + (
      "freed buffers kept (jaxcap.host_memory)" if info.get("glibc_tunables") else "glibc defaults (unmapped on free)"
    ),
  ]


def _busy_seconds() -> float | None:
  """CPU seconds the whole machine has spent busy (all cores, all processes, incl. steal) since boot."""
  try:
    with open("/proc/stat") as f:
      fields = [int(x) for x in f.readline().split()[1:]]
  except (OSError, ValueError):
    return None
  # user nice system idle iowait irq softirq steal (guest time is already inside user)
  busy = sum(fields[:3]) + sum(fields[5:8])
  return busy / os.sysconf("SC_CLK_TCK")


def _own_cpu_seconds() -> float:
  r = resource.getrusage(resource.RUSAGE_SELF)  # all threads of this process
  return r.ru_utime + r.ru_stime


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
    for line in _machine_lines(self.machine):
      print(line)
    print(f"load average (1 min): {LOAD_AT_START:.2f} at start, {self.load_before:.2f} before timing")
    if self.reasons:
      print(self.warning)
    sys.stdout.flush()
    self._busy0, self._own0, self._t0 = _busy_seconds(), _own_cpu_seconds(), time.perf_counter()
    return self

  def __exit__(self, *exc) -> None:
    self.wall_s = time.perf_counter() - self._t0
    busy1, own1 = _busy_seconds(), _own_cpu_seconds()
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


def _side(times: list[float], warmup_s: float | None, work: float) -> dict:
  lo, med = min(times), statistics.median(times)
  return dict(
    warmup_s=warmup_s,
    times_s=times,
    min_s=lo,
    median_s=med,
    max_s=max(times),
    speed_at_min=work / lo,
    speed_at_median=work / med,
  )


def fractions(model_flops_per_call: float, seconds: float, ceilings: dict) -> dict:
  """Model GFLOP/s of a call and its fraction of each GEMM ceiling (a `benchmarks.ceilings` record)."""
  rate = model_flops_per_call / seconds / 1e9
  out = {"model_gflops": rate, "of_xla_gemm": rate / ceilings["xla_gemm_gflops"]}
  if "torch_gemm_gflops" in ceilings:
    out["of_torch_gemm"] = rate / ceilings["torch_gemm_gflops"]
  return out


def print_ceilings(c: dict) -> None:
  line = f"ceilings: XLA f32 GEMM {c['xla_gemm_gflops']:.0f} GFLOP/s"
  if "torch_gemm_gflops" in c:
    line += f", torch f32 GEMM {c['torch_gemm_gflops']:.0f} GFLOP/s"
  line += f", copy bandwidth {c['bandwidth_gbs']:.1f} GB/s (best over the model's matmul shapes"
  runs = c.get("measurements", [])
  if len(runs) > 1:  # before and after the timed section
    line += "; best of runs at " + " / ".join(f"{r['xla_gemm_gflops']:.0f}" for r in runs) + " GFLOP/s"
  print(line + ")")


def report(
  title: str,
  work: float,
  unit: str,
  times: dict[str, list[float]],
  warmup: dict[str, float | None],
  section: Section,
  extra: dict | None = None,
  args=None,
  json_path: str | None = None,
  flops_per_call: float | None = None,
  ceilings: dict | None = None,
) -> dict:
  """Prints the table and the ratio of mins (first side's speed / second side's), the load after timing and any
  warning; writes everything as JSON to `json_path` if given. `work` is what one call does, in the unit of
  `unit` times seconds (e.g. tokens, for tokens/s). Returns the JSON record."""
  sides = {name: _side(t, warmup.get(name), work) for name, t in times.items() if t}
  names = list(sides)
  record = dict(
    benchmark=title,
    date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    argv=sys.argv,
    args=vars(args) if args is not None else None,
    machine=section.machine,
    load_average_1min=dict(start=LOAD_AT_START, before=section.load_before, after=section.load_after),
    other_processes_cores=section.other_cores,
    timed_wall_s=section.wall_s,
    quiet=not section.reasons,
    not_quiet_because=section.reasons,
    unit=unit,
    work_per_call=work,
    sides=sides,
    extra=extra or {},
  )
  if flops_per_call and ceilings:
    # model FLOPs/s at each side's min time over the machine's measured GEMM ceilings (MFU-style)
    record["model_flops_per_call"] = flops_per_call
    record["ceilings"] = ceilings
    for side in sides.values():
      side["ceiling_fractions"] = fractions(flops_per_call, side["min_s"], ceilings)
  if len(names) == 2:
    a, b = sides[names[0]], sides[names[1]]
    record["ratio"] = f"{names[0]} / {names[1]}"
    record["ratio_of_mins"] = b["min_s"] / a["min_s"]
    record["ratio_of_medians"] = b["median_s"] / a["median_s"]

  width = max(len(n) for n in names)
  print(f"\n{title}: {work:g} {unit.split('/')[0]} per call")
  print(
    f"{'':{width}}  {'warm-up':>9}  {'calls':>5}  {'min':>9}  {'median':>9}  {'max':>9}  "
    f"{unit + ' (min)':>18}  {unit + ' (median)':>21}"
  )
  for name, s in sides.items():
    warm = f"{s['warmup_s']:.2f} s" if s["warmup_s"] is not None else "-"
    print(
      f"{name:{width}}  {warm:>9}  {len(s['times_s']):>5}  {s['min_s']:>7.3f} s  {s['median_s']:>7.3f} s  "
      f"{s['max_s']:>7.3f} s  {s['speed_at_min']:>18.1f}  {s['speed_at_median']:>21.1f}"
    )
  if "ratio_of_mins" in record:
    print(
      f"ratio {names[0]}/{names[1]} ({unit}): {record['ratio_of_mins']:.2f}x from the mins "
      f"({record['ratio_of_medians']:.2f}x from the medians)"
    )
  if "ceilings" in record:
    print_ceilings(record["ceilings"])
    for name, side in sides.items():
      f = side["ceiling_fractions"]
      torch_part = f", {100 * f['of_torch_gemm']:.0f}% of torch's" if "of_torch_gemm" in f else ""
      print(
        f"  {name}: {f['model_gflops']:.0f} model GFLOP/s at its min = {100 * f['of_xla_gemm']:.0f}% of XLA's GEMM "
        f"ceiling{torch_part}"
      )
  for key, value in (extra or {}).items():
    print(f"{key}: {value:.6g}" if isinstance(value, float) else f"{key}: {value}")
  others = f"{section.other_cores:.2f}" if section.other_cores is not None else "?"
  print(
    f"load average (1 min): {LOAD_AT_START:.2f} at start, {section.load_before:.2f} before timing, "
    f"{section.load_after:.2f} after (includes this run); other processes kept {others} cores busy during "
    f"the {section.wall_s:.1f} s timed section"
  )
  if section.reasons:
    print(section.warning)
  if json_path:
    with open(json_path, "w") as f:
      json.dump(record, f, indent=2)
      f.write("\n")
    print(f"wrote {json_path}")
  return record
