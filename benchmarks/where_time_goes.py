"""Where the time goes: a `jax.profiler` trace of one path, each XLA op's wall time attributed to the model part
its source line belongs to.

    python -m benchmarks.where_time_goes --path update [--scanned] [--calls 3] [--json update_profile.json]
    python -m benchmarks.where_time_goes --path forward
    python -m benchmarks.where_time_goes --path decode        # one rollout call: prefill + 63 decode steps
    python -m benchmarks.where_time_goes --path forward --floor   # + the program's matmuls timed alone

Same `mid()` shapes as train_step.py / forward.py / rollout.py (8 prompts of one 224x224 image; update: 64 target
tokens each; decode: 8 images x 4 samples x 64 new tokens), float32, random weights (no transformers needed).
Layers run unrolled (`scan_layers=False`, the main job's CPU setting) unless `--scanned`.

How time is attributed: the trace's leaf events on XLA's CPU threads (an op, e.g. one matmul fusion) are swept
in time order and every instant is split equally among the ops running then, so the parts sum to the device's
busy time and ops that overlap on the two cores are not counted twice (`op_attribution.py`). Each op is mapped
through the compiled HLO's stack frames (`hlo_source.py`) to the innermost jaxcap (or optax) function that emitted
it, then to a part (`op_attribution.part_of`). Matmuls ("dot") and everything else are listed apart. Tracing adds a
little overhead; the untimed wall time per call is printed beside the traced one. The programs are built in
`profiled_paths.py`, `--floor` is `matmul_floor.py`.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run as a file (python benchmarks/where_time_goes.py): the repository root, for `benchmarks.*`
  sys.path.append(str(Path(__file__).resolve().parents[1]))

from benchmarks.hlo_source import source_map  # noqa: E402
from benchmarks.machine import machine_info  # noqa: E402
from benchmarks.matmul_floor import print_floor  # noqa: E402
from benchmarks.op_attribution import attribute  # noqa: E402
from benchmarks.profiled_paths import PATHS  # noqa: E402


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--path", choices=sorted(PATHS), default="update")
  ap.add_argument("--scanned", action="store_true", help="layers under lax.scan (the real-checkpoint setting)")
  ap.add_argument("--calls", type=int, default=3, help="traced calls (after 2 untraced warm-up calls)")
  ap.add_argument("--ops", type=int, default=0, help="also list the N costliest ops (name, shape, part)")
  ap.add_argument("--json", metavar="PATH", help="also write the table as JSON")
  ap.add_argument(
    "--floor",
    action="store_true",
    help="also time the program's matmuls alone and bound the fraction of the GEMM ceiling any program with these "
    "matmuls can reach (forward / update, unrolled)",
  )
  args = ap.parse_args()
  if args.floor and (args.path == "decode" or args.scanned):
    ap.error("--floor reads one loop-free program: --path forward or update, without --scanned")

  dump = tempfile.mkdtemp(prefix="jaxcap_hlo_")
  if args.path == "decode":  # several programs (prefill, decode loop): read their HLO from XLA's dump
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={dump} --xla_dump_hlo_as_text"
  import jax

  hlo, call, flops = PATHS[args.path](args.scanned)
  texts = [hlo] if hlo else [open(p).read() for p in glob.glob(os.path.join(dump, "*after_optimizations.txt"))]
  table = {}
  for text in texts:  # decode: op names repeat across programs (prefill, loop); a later program's entry wins
    table.update(source_map(text))
  call()
  call()
  t0 = time.perf_counter()
  for _ in range(args.calls):
    call()
  wall_ms = (time.perf_counter() - t0) / args.calls * 1e3
  trace = tempfile.mkdtemp(prefix="jaxcap_trace_")
  options = jax.profiler.ProfileOptions()
  options.python_tracer_level = 0
  jax.profiler.start_trace(trace, profiler_options=options)
  t0 = time.perf_counter()
  for _ in range(args.calls):
    call()
  traced_ms = (time.perf_counter() - t0) / args.calls * 1e3
  jax.profiler.stop_trace()
  path = sorted(glob.glob(os.path.join(trace, "**", "*.xplane.pb"), recursive=True))[-1]
  parts, busy_ms, ops = attribute(path, table, args.calls)

  info = machine_info()
  print(f"machine: {info.get('cpu_model', '?')}, {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}")
  print(f"path: {args.path} ({'scanned' if args.scanned else 'unrolled'} layers), {args.calls} traced calls")
  print(f"wall per call: {wall_ms:.0f} ms untraced, {traced_ms:.0f} ms traced; ops busy {busy_ms:.0f} ms")
  print(f"{'part':70s} {'ms/call':>8s} {'share':>6s}")
  for name, ms in sorted(parts.items(), key=lambda kv: -kv[1]):
    print(f"{name:70s} {ms:8.1f} {100 * ms / busy_ms:5.1f}%")
  for ms, name, part, shape in ops[: args.ops]:
    print(f"  {ms:8.2f} ms  {name:32s} {shape:40s} {part}")
  floor = print_floor(hlo, flops, wall_ms) if args.floor else None
  if args.json:
    with open(args.json, "w") as f:
      json.dump(
        dict(
          path=args.path,
          scanned=args.scanned,
          wall_ms=wall_ms,
          traced_ms=traced_ms,
          busy_ms=busy_ms,
          parts=parts,
          floor=floor,
          machine=info,
        ),
        f,
        indent=2,
      )


if __name__ == "__main__":
  from jaxcap.host_memory import retain_on_cpu

  retain_on_cpu()  # as the launcher does (JAXCAP_HOST_MALLOC=system: glibc defaults)
  main()
