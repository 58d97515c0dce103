"""RL steps per second against a slow judge for today's step, streaming judging, streaming + one-step off-policy
and asynchronous RL (rl.max_staleness = 2, colocated or on rollout devices of their own), the share of each step's
wall time the device was busy, and the learner's and the rollout devices' idle shares.

Runs the main job (`Trainer`, in this process) on the embedded default (`configs/caprl.py`, the tiny student, as
`benchmarks/rl_host_time.py` sets it up: short SFT warm start, no held-out evaluation, no mid-run checkpoints),
once per arm and repeat, the arms interleaved (today, stream, stream_off1, today, ...). Arms:

    today         rl.stream_judging=False, rl.max_staleness=0   (the batch judged after its rollout)
    off1          rl.stream_judging=False, rl.max_staleness=1
    stream        rl.stream_judging=True,  rl.max_staleness=0   (each group judged as it finishes decoding)
    stream_off1   rl.stream_judging=True,  rl.max_staleness=1
    async2        rl.stream_judging=True,  rl.max_staleness=2   (colocated: the loop rolls out 2 steps ahead)
    async2_split  rl.stream_judging=True,  rl.max_staleness=2,  rollout.devices = half of this process's devices
                  (a rollout thread on its own devices; the learner on the others)
    partial2_split  rl.stream_judging=True, rl.max_staleness=2, rl.partial_rollouts, rollout.devices = half
                  (one engine per rollout device, each over its block of every round)

The split arm needs several devices: on a CPU, `XLA_FLAGS=--xla_force_host_platform_device_count=8` (every arm
then runs on the 8 virtual devices, the learner's mesh of the split arm on 4 of them). What a CPU cannot show:
its virtual devices share the host's cores, so the split arm's rollout and learner devices compete for the same
two cores, and `device_busy_fraction` counts the XLA CPU threads of all of them together. The idle shares are
measured by the loop instead: `learner_idle_fraction` is the share of the window the loop blocked on a round's
rollout or its rewards (an upper bound: the passes it dispatched last may still be running), and
`rollout_idle_fraction` (split arm) the share the rollout devices were not rolling out. On a pod or a GPU node the
two device sets run in parallel for real.

`--judge http` (default): the judge is the embedded world's rule-based oracle behind its OpenAI-compatible server
(`jaxcap.world.judge_server`, in a thread of this process, over localhost), which adds `--judge-latency-ms` to
every request; the run talks to it as to a remote fleet (`judge.kind=http`, `judge.max_concurrency` requests in
flight). One server per latency in `--latencies`. `--judge sleep`: the judge is the in-process oracle and the
latency a sleep per CapRL call on the reward's thread (the first version of this benchmark): per step, or per group
when streaming, so that mode does not compare streaming arms fairly. The rollouts
come from `--engine` (paged: the engine that hands groups over as they finish; with the static engine streaming
changes nothing).

`--length-spread LO` caps each group's captions at a length drawn uniformly from [LO, --new_tokens] (the paged
engine's per-row `max_lengths`, seeded by the rollout's index, the same in every arm): the tiny student after a
2-step SFT writes max-length captions, so without it every group finishes in the last decode segment and streaming
has nothing to overlap; a trained student's captions vary in length. Compiled programs are kept in a persistent
cache shared by the runs, and one unrecorded run of the first arm fills it first (`--no-prime` skips it), so no
arm pays the paged engine's compilations of new buckets inside its timed window more than another (one priming
run per device layout, and one more for partial rollouts: a split arm's rollout programs are compiled for its own
devices, the partial engine's for its reused rows and grown pool).

After `--warmup` RL steps (compiles) the next `--steps` are timed from the start of one step's update call to the
start of the call after the last, and traced with `jax.profiler` for the device-busy share
(`rl_host_time.device_busy_ns`; on a CPU the "device" shares the cores with the host threads and the judge server,
so that share is only indicative there). `judge_wait_s` is the time per timed step the loop blocked on the step's
rewards (the judging tail the device may idle through).

    python -m benchmarks.rl_throughput --latencies 50,200,800 --repeats 1 --steps 3 --length-spread 4
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import jax

if not __package__:  # run as a file (python benchmarks/rl_throughput.py): the repository root, for `benchmarks.*`
  sys.path.append(str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import cpu_model  # noqa: E402
from benchmarks.rl_arm_run import ARMS, one_run, rollout_devices  # noqa: E402
from benchmarks.rl_host_time import _config  # noqa: E402

KEY = "rl-throughput-benchmark"


@contextlib.contextmanager
def _judge_server(args, latency_ms: float):
  """The URL of the world's oracle judge served over HTTP with `latency_ms` added per request (None: in process)."""
  if args.judge != "http":
    yield None
    return
  from benchmarks.judge_overlap import start_server
  from jaxcap.world.judge_server import rule_based_app_for_manifest
  from jaxcap.world.student import build_world_manifests

  # the run builds the same world (same config and seed) in its own workdir: the server judges its image ids
  world = tempfile.mkdtemp(prefix="rl_throughput_world_")
  train, _ = build_world_manifests(_config(args, world), Path(world))
  app = rule_based_app_for_manifest(str(train), added_latency_s=latency_ms / 1e3, api_key=KEY)
  server, url = start_server(app)
  try:
    yield url
  finally:
    server.should_exit = True


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--judge", choices=("http", "sleep"), default="http", help="the oracle over HTTP, or a sleep")
  ap.add_argument("--latencies", default="200", help="ms added per request (http) or per step's judging (sleep)")
  ap.add_argument("--judge-latency-ms", type=float, default=None, help="one latency (overrides --latencies)")
  ap.add_argument("--concurrency", type=int, default=8, help="judge.max_concurrency: requests in flight (http)")
  ap.add_argument(
    "--arms", default="today,stream,stream_off1,async2_split", help=f"comma-separated, of {', '.join(ARMS)}"
  )
  ap.add_argument("--engine", choices=("paged", "static"), default="paged", help="rollout.engine")
  ap.add_argument("--repeats", type=int, default=1, help="runs per arm, interleaved")
  ap.add_argument("--steps", type=int, default=3, help="RL steps timed per run")
  ap.add_argument("--warmup", type=int, default=2, help="RL steps before the timed ones (compilation)")
  ap.add_argument("--batch", type=int, default=4, help="prompts per RL step (rl.batch_size)")
  ap.add_argument("--samples", type=int, default=4, help="G (rl.num_samples)")
  ap.add_argument("--new_tokens", type=int, default=32, help="sampling.max_new_tokens")
  ap.add_argument("--image_size", type=int, default=84, help="data.image_size")
  ap.add_argument("--sft_steps", type=int, default=2)
  ap.add_argument("--vision_steps", type=int, default=2)
  ap.add_argument("--length-spread", type=int, default=0, help="cap each group's captions at U[this, new_tokens]")
  ap.add_argument("--no-prime", action="store_true", help="no unrecorded first run filling the compilation cache")
  ap.add_argument("--out", default="", help="write the figures as JSON here")
  args = ap.parse_args(argv)
  jax.config.update("jax_compilation_cache_dir", tempfile.mkdtemp(prefix="rl_throughput_cache_"))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  os.environ["JUDGE_API_KEY"] = KEY  # judge.api_key_env's default variable: the key the server was started with
  arms = [a.strip() for a in args.arms.split(",") if a.strip()]
  unknown = [a for a in arms if a not in ARMS]
  if unknown:
    ap.error(f"--arms: unknown {unknown}; choose from {', '.join(ARMS)}")
  if any(ARMS[a][2] for a in arms) and jax.local_device_count() < 2:
    ap.error(
      "the split arms need several devices; on a CPU run with XLA_FLAGS=--xla_force_host_platform_device_count=8"
    )
  latencies = (
    [args.judge_latency_ms] if args.judge_latency_ms is not None else [float(x) for x in args.latencies.split(",")]
  )

  out = {
    "backend": jax.default_backend(),
    "cpu": cpu_model(),
    "cpu_count": os.cpu_count(),
    "load_average_start": os.getloadavg(),
    "judge": args.judge,
    "engine": args.engine,
    "concurrency": args.concurrency,
    "shape": {"batch": args.batch, "samples": args.samples, "new_tokens": args.new_tokens, "image": args.image_size},
    "length_spread": args.length_spread,
    "steps_timed": args.steps,
    "repeats": args.repeats,
    "latencies": {},
  }
  keys = ("steps_per_s", "s_per_step", "device_busy_fraction", "judge_wait_s", "learner_idle_fraction")
  if not args.no_prime:  # one per device layout: a split arm's rollouts compile programs of their own devices
    primes = {(rollout_devices(arm), ARMS[arm][3]): arm for arm in reversed(arms)}  # partial: programs of its own
    with _judge_server(args, latencies[0]) as url:
      for arm in primes.values():
        print(f"priming run ({arm}): {json.dumps(one_run(args, arm, 'prime', url, latencies[0]))}", flush=True)
  for latency in latencies:
    runs = {arm: [] for arm in arms}
    with _judge_server(args, latency) as url:
      for r in range(args.repeats):
        for arm in arms:
          runs[arm].append(one_run(args, arm, f"{arm}_{int(latency)}_{r}", url, latency))
          print(f"latency {latency:g} ms, {arm}, repeat {r}: {json.dumps(runs[arm][-1])}", flush=True)
    med = {arm: {k: statistics.median(x[k] for x in runs[arm]) for k in keys} for arm in arms}
    for arm in arms:
      idle = [x["rollout_idle_fraction"] for x in runs[arm] if x["rollout_idle_fraction"] is not None]
      med[arm]["rollout_idle_fraction"] = statistics.median(idle) if idle else None
      for base in ("today", "stream_off1"):
        if base in med:
          med[arm][f"speedup_vs_{base}"] = med[arm]["steps_per_s"] / med[base]["steps_per_s"]
    out["latencies"][f"{latency:g}"] = {"median": med, "runs": runs}
  out["load_average_end"] = os.getloadavg()
  summary = {k: v for k, v in out.items() if k != "latencies"}
  summary["median"] = {lat: v["median"] for lat, v in out["latencies"].items()}
  print(json.dumps(summary, indent=2))
  if args.out:
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
  return out


if __name__ == "__main__":
  sys.exit(main() and 0)
