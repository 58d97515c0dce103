"""The report of a benchmark timed through `benchmarks.harness`: per side min / median / max seconds per call and
the speed at each, the ratio of the mins (first side's speed / second side's), the fraction of the machine's GEMM
ceilings each side reaches (given a `benchmarks.ceilings` record), the load during the run and any warning;
`--json PATH` writes all of it (every call's time too), so README tables can be regenerated from files.
"""

from __future__ import annotations

import datetime
import json
import statistics
import sys

from benchmarks.ceilings import fractions, print_ceilings
from benchmarks.harness import Section
from benchmarks.machine import LOAD_AT_START


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
