"""Per-step host time of the RL loop, from a profile: wall time per step split into device-busy and host time.

Runs the main job (`Trainer`) on the embedded default (`configs/caprl.py`) at its RL shape (8 prompts x G = 8
samples x 48 new tokens, the tiny student) with a short SFT warm start, no held-out evaluation and no mid-run
checkpoints. After `--warmup` RL steps (compilation), a `jax.profiler` trace covers the next `--steps` RL steps:
from the start of one step to the start of the step after the last (a step starts when the loop asks the loader
for its batch: the same event whether or not the loop defers fetching metrics). Device-busy time is the union of
the intervals in which the device executed XLA ops (GPU / TPU: the device planes; CPU: the XLA CPU client's and
Eigen's threads); host time is the rest of the wall time, i.e. when the device waited for the host (image
loading, host <-> device copies, text decoding, judging not overlapped, metric fetches).

    python -m benchmarks.rl_host_time --steps 6 --warmup 2 --out rl_host_time.json
    PYTHONPATH=/tmp/base python benchmarks/rl_host_time.py   # another checkout of jaxcap (e.g. a git worktree)

(The second form runs the file, not the module: `-m` puts the current directory, and so this checkout's jaxcap,
ahead of PYTHONPATH.)

On a CPU the "device" shares the cores with the host threads (judge, image decoding), so the split is only
indicative there; the figures that matter come from a GPU / TPU.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import jax


def _config(args, workdir: str):
  import jaxcap

  root = Path(jaxcap.__file__).resolve().parents[1]  # the checkout whose jaxcap is imported
  spec = importlib.util.spec_from_file_location("caprl_config", root / "configs" / "caprl.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config()
  c.workdir = workdir
  c.sft.steps = args.sft_steps
  c.vision_warmup.steps = args.vision_steps
  c.vision_warmup.batch_size = 4
  c.rl.steps = args.warmup + args.steps + 1  # the window ends where the last measured step's successor starts
  c.rl.batch_size = args.batch
  c.rl.num_samples = args.samples
  c.sampling.max_new_tokens = args.new_tokens
  c.data.image_size = args.image_size
  c.world.train_scenes = max(64, args.batch * 4)
  c.world.eval_scenes = 8
  c.eval.every = 0
  c.eval.num_images = 0
  c.checkpoint.every = 0
  c.export.hf = False
  return c


def device_busy_ns(xspace_path: str, window: tuple[int, int] | None = None) -> tuple[int, int, str]:
  """(busy ns, traced span ns, what counted as the device) from an .xplane.pb: the union of op intervals on the
  device planes (GPU / TPU), or on the XLA CPU threads when there is no device plane; `window` (ns, the
  profile's clock) clips them."""
  from jax.profiler import ProfileData

  data = ProfileData.from_file(xspace_path)
  # GPU / TPU planes only: an installed libtpu adds a "/device:CUSTOM:..." plane with no device ops even on CPU
  device_planes = [p for p in data.planes if p.name.startswith(("/device:GPU", "/device:TPU"))]
  intervals, span_lo, span_hi = [], None, None
  if device_planes:
    what = ", ".join(p.name for p in device_planes)
    lines = [ln for p in device_planes for ln in p.lines]
  else:
    what = "XLA CPU client + Eigen threads of /host:CPU"
    lines = [ln for p in data.planes if p.name == "/host:CPU" for ln in p.lines if ln.name.startswith("tf_XLA")]
  for plane in data.planes:  # the traced span: every event of the host plane
    if plane.name == "/host:CPU":
      for ln in plane.lines:
        for e in ln.events:
          span_lo = e.start_ns if span_lo is None else min(span_lo, e.start_ns)
          span_hi = e.start_ns + e.duration_ns if span_hi is None else max(span_hi, e.start_ns + e.duration_ns)
  for ln in lines:
    for e in ln.events:
      if e.duration_ns <= 0 or e.name.startswith(("ThreadpoolListener", "end: ")):
        continue
      intervals.append((e.start_ns, e.start_ns + e.duration_ns))
  lo, hi = window if window is not None else (span_lo or 0, span_hi or 0)
  busy, cur_lo, cur_hi = 0, None, None
  for a, b in sorted(intervals):
    a, b = max(a, lo), min(b, hi)
    if b <= a:
      continue
    if cur_hi is None or a > cur_hi:
      busy += 0 if cur_hi is None else cur_hi - cur_lo
      cur_lo, cur_hi = a, b
    else:
      cur_hi = max(cur_hi, b)
  busy += 0 if cur_hi is None else cur_hi - cur_lo
  return busy, hi - lo, what


def _window_ns(xspace_path: str, name: str) -> tuple[int, int] | None:
  from jax.profiler import ProfileData

  for plane in ProfileData.from_file(xspace_path).planes:
    for ln in plane.lines:
      for e in ln.events:
        if e.name == name:
          return e.start_ns, e.start_ns + e.duration_ns
  return None


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--steps", type=int, default=6, help="RL steps measured")
  ap.add_argument("--warmup", type=int, default=2, help="RL steps before the trace (compilation)")
  ap.add_argument("--batch", type=int, default=8, help="prompts per RL step (rl.batch_size)")
  ap.add_argument("--samples", type=int, default=8, help="G (rl.num_samples)")
  ap.add_argument("--new_tokens", type=int, default=48, help="sampling.max_new_tokens")
  ap.add_argument("--image_size", type=int, default=84, help="data.image_size: images resized to this side")
  ap.add_argument("--sft_steps", type=int, default=2)
  ap.add_argument("--vision_steps", type=int, default=2)
  ap.add_argument("--workdir", default="", help="default: a temporary folder")
  ap.add_argument("--out", default="", help="write the figures as JSON here")
  args = ap.parse_args(argv)

  import jaxcap
  from jaxcap.config_files import validate
  from jaxcap.train.shell import trainer as loop

  workdir = args.workdir or tempfile.mkdtemp(prefix="rl_host_time_")
  trace_dir = os.path.join(workdir, "trace")
  config = _config(args, workdir)
  first, last = args.warmup, args.warmup + args.steps
  marks: dict[str, float] = {}
  annotation = jax.profiler.TraceAnnotation("rl_window")
  phase = {"name": ""}

  def mark(step: int) -> None:
    """At the start of RL step `step` (0-based): the window is [start of step `first`, start of step `last`)."""
    if step == first:
      options = jax.profiler.ProfileOptions()
      options.python_tracer_level = 0  # the Python tracer would slow the host side down many times over
      jax.profiler.start_trace(trace_dir, profiler_options=options)
      annotation.__enter__()
      marks["t0"] = time.perf_counter()
    elif step == last:
      marks["t1"] = time.perf_counter()
      annotation.__exit__(None, None, None)
      jax.profiler.stop_trace()

  class Marked:
    """The loader, marking the start of each RL step (its `next`): the same event whatever the loop defers."""

    def __init__(self, it):
      self.it, self.calls = it, 0

    def __next__(self):
      if phase["name"] == "rl":
        mark(self.calls)
        self.calls += 1
      return next(self.it)

    def __iter__(self):
      return self

    def __getattr__(self, name):
      return getattr(self.it, name)

  record_loader, run_phase = loop.record_loader, loop.Trainer.run_phase

  def marked_run_phase(self, name, *a, **kw):
    phase["name"] = name
    return run_phase(self, name, *a, **kw)

  loop.record_loader = lambda *a, **kw: Marked(record_loader(*a, **kw))
  loop.Trainer.run_phase = marked_run_phase
  try:
    loop.Trainer(validate(config)).run()
  finally:
    loop.record_loader, loop.Trainer.run_phase = record_loader, run_phase
  wall = marks["t1"] - marks["t0"]
  path = sorted(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True))[-1]
  window = _window_ns(path, "rl_window")
  busy_ns, span_ns, what = device_busy_ns(path, window)
  busy = busy_ns / 1e9
  out = {
    "jaxcap": str(Path(jaxcap.__file__).parent),
    "backend": jax.default_backend(),
    "shape": {"batch": args.batch, "samples": args.samples, "new_tokens": args.new_tokens, "image": args.image_size},
    "steps": args.steps,
    "wall_s_per_step": wall / args.steps,
    "device_busy_s_per_step": busy / args.steps,
    "host_s_per_step": (wall - busy) / args.steps,
    "device_busy_fraction": busy / wall,
    "traced_window_s": span_ns / 1e9,
    "device": what,
    "load_average": os.getloadavg()[0],
  }
  print(json.dumps(out, indent=2))
  if args.out:
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
  return out


if __name__ == "__main__":
  sys.exit(main() and 0)
