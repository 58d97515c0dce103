"""RL steps per second on-policy vs one-step off-policy (`rl.off_policy_steps` 0 vs 1) against a judge with a
fixed latency, and the share of each step's wall time the device was busy.

Runs the main job (`Trainer`, in this process) on the embedded default (`configs/caprl.py`, the tiny student, as
`benchmarks/rl_host_time.py` sets it up: short SFT warm start, no held-out evaluation, no mid-run checkpoints),
once per arm and repeat, the arms interleaved (on, off, on, off, ...). The judge's latency is added in the training
reward's call (a sleep of `--judge-latency-ms` per step's judging, on the reward's host thread, as an HTTP judge
blocks it), so the embedded rule-based judge stands in for a slow remote one. After `--warmup` RL steps (compiles)
the next `--steps` are timed from the start of one step's update call to the start of the call after the last,
and traced with `jax.profiler` for the device-busy share (`rl_host_time.device_busy_ns`; on a CPU the "device"
shares the cores with the host threads, so that share is only indicative there).

    python -m benchmarks.rl_throughput --judge-latency-ms 2000 --repeats 2
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import jax

from benchmarks.rl_host_time import _config, _window_ns, device_busy_ns


def _one_run(args, off_policy_steps: int, tag: str) -> dict:
  from jaxcap.rewards import caprl
  from jaxcap.train import loop
  from jaxcap.train.updates import RLUpdate

  workdir = tempfile.mkdtemp(prefix=f"rl_throughput_{tag}_")
  trace_dir = os.path.join(workdir, "trace")
  config = _config(args, workdir)
  config.rl.off_policy_steps = off_policy_steps
  first, last = args.warmup, args.warmup + args.steps
  marks, calls = {}, {"n": 0}
  annotation = jax.profiler.TraceAnnotation("rl_window")

  def mark(step: int) -> None:
    if step == first:
      options = jax.profiler.ProfileOptions()
      options.python_tracer_level = 0
      jax.profiler.start_trace(trace_dir, profiler_options=options)
      annotation.__enter__()
      marks["t0"] = time.perf_counter()
    elif step == last:
      marks["t1"] = time.perf_counter()
      annotation.__exit__(None, None, None)
      jax.profiler.stop_trace()

  update_call, reward_call = RLUpdate.__call__, caprl.CapRLReward.__call__
  latency = args.judge_latency_ms / 1e3

  def marked_update(self, *a, **kw):
    mark(calls["n"])
    calls["n"] += 1
    return update_call(self, *a, **kw)

  def slow_reward(self, *a, **kw):
    time.sleep(latency)
    return reward_call(self, *a, **kw)

  RLUpdate.__call__, caprl.CapRLReward.__call__ = marked_update, slow_reward
  try:
    loop.Trainer(config).run()
  finally:
    RLUpdate.__call__, caprl.CapRLReward.__call__ = update_call, reward_call
  wall = marks["t1"] - marks["t0"]
  path = sorted(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True))[-1]
  busy_ns, _, what = device_busy_ns(path, _window_ns(path, "rl_window"))
  rows = [json.loads(line) for line in (Path(workdir) / "metrics.jsonl").read_text().splitlines()]
  staleness = [r.get("offpolicy/staleness") for r in rows if r.get("phase") == "rl" and "loss" in r]
  return {
    "steps_per_s": args.steps / wall,
    "s_per_step": wall / args.steps,
    "device_busy_fraction": busy_ns / 1e9 / wall,
    "staleness": staleness,
    "device": what,
  }


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--judge-latency-ms", type=float, default=2000, help="added to each step's judging")
  ap.add_argument("--repeats", type=int, default=2, help="runs per arm, interleaved")
  ap.add_argument("--steps", type=int, default=4, help="RL steps timed per run")
  ap.add_argument("--warmup", type=int, default=2, help="RL steps before the timed ones (compilation)")
  ap.add_argument("--batch", type=int, default=8, help="prompts per RL step (rl.batch_size)")
  ap.add_argument("--samples", type=int, default=8, help="G (rl.num_samples)")
  ap.add_argument("--new_tokens", type=int, default=48, help="sampling.max_new_tokens")
  ap.add_argument("--image_size", type=int, default=84, help="data.image_size")
  ap.add_argument("--sft_steps", type=int, default=2)
  ap.add_argument("--vision_steps", type=int, default=2)
  ap.add_argument("--out", default="", help="write the figures as JSON here")
  args = ap.parse_args(argv)

  runs = {0: [], 1: []}
  for r in range(args.repeats):
    for arm in (0, 1):
      runs[arm].append(_one_run(args, arm, f"{arm}_{r}"))
      print(f"off_policy_steps={arm} repeat {r}: {json.dumps(runs[arm][-1])}", flush=True)
  med = lambda arm, k: statistics.median(x[k] for x in runs[arm])
  out = {
    "backend": jax.default_backend(),
    "cpu": _cpu_model(),
    "load_average": os.getloadavg(),
    "judge_latency_ms": args.judge_latency_ms,
    "shape": {"batch": args.batch, "samples": args.samples, "new_tokens": args.new_tokens, "image": args.image_size},
    "steps_timed": args.steps,
    "repeats": args.repeats,
    "on_policy": {k: med(0, k) for k in ("steps_per_s", "s_per_step", "device_busy_fraction")},
    "off_policy_1": {k: med(1, k) for k in ("steps_per_s", "s_per_step", "device_busy_fraction")},
    "runs": runs,
  }
  out["speedup_off_vs_on"] = out["off_policy_1"]["steps_per_s"] / out["on_policy"]["steps_per_s"]
  print(json.dumps({k: v for k, v in out.items() if k != "runs"}, indent=2))
  if args.out:
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
  return out


def _cpu_model() -> str:
  try:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith("model name"):
        return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return "unknown"


if __name__ == "__main__":
  sys.exit(main() and 0)
