"""One run of an arm of `benchmarks.rl_throughput`: the main job (`Trainer`, in this process) with the arm's
judging settings, its RL update, reward submission and paged rollouts wrapped to mark the timed window, time the
loop's blocking on rewards and cap each group's caption length; returns the window's figures (steps/s, device-busy
share from a `jax.profiler` trace, judge wait)."""

from __future__ import annotations

import glob
import json
import os
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from benchmarks.rl_host_time import _config, _window_ns, device_busy_ns

# arm -> (rl.stream_judging, rl.max_staleness, rollout.devices, rl.partial_rollouts)
ARMS = {
  "today": (False, 0, 0, False),
  "off1": (False, 1, 0, False),
  "stream": (True, 0, 0, False),
  "stream_off1": (True, 1, 0, False),
  "async2": (True, 2, 0, False),  # k = 2 colocated
  "async2_split": (True, 2, -1, False),  # k = 2, half of the devices roll out, the learner has the other half
  "partial2_split": (True, 2, -1, True),  # k = 2, partial rollouts on half of the devices (an engine each)
}


def rollout_devices(arm: str) -> int:
  """The arm's rollout.devices in this process (-1: half of the devices)."""
  n = ARMS[arm][2]
  return jax.local_device_count() // 2 if n < 0 else n


class _TimedFuture:
  """A reward future whose `result()` adds the time it blocked to `waits` (when the window is open)."""

  def __init__(self, future, waits: list, window: dict):
    self.future, self.waits, self.window = future, waits, window

  def result(self, timeout=None):
    t = time.perf_counter()
    out = self.future.result(timeout)
    if self.window.get("open"):
      self.waits.append(time.perf_counter() - t)
    return out


def _spans(fn, spans: list):
  """`fn` appending each call's (start, end) perf_counter span to `spans`."""

  def timed(*a, **kw):
    t = time.perf_counter()
    try:
      return fn(*a, **kw)
    finally:
      spans.append((t, time.perf_counter()))

  return timed


def one_run(args, arm: str, tag: str, judge_url: str | None, latency_ms: float) -> dict:
  from jaxcap.rewards import caprl
  from jaxcap.config_files import validate
  from jaxcap.train.shell import trainer as loop
  from jaxcap.train.learner.rl import RLUpdate
  from jaxcap.train.rollouts.source import RolloutSource

  stream, staleness, _, partial = ARMS[arm]
  workdir = tempfile.mkdtemp(prefix=f"rl_throughput_{tag}_")
  trace_dir = os.path.join(workdir, "trace")
  config = _config(args, workdir)
  config.rl.max_staleness = staleness
  config.rl.partial_rollouts = partial
  config.rl.stream_judging = stream
  config.rollout.devices = rollout_devices(arm)
  config.rollout.engine = args.engine
  if judge_url is not None:
    config.judge.kind = "http"
    config.judge.endpoints = judge_url
    config.judge.max_concurrency = args.concurrency
    config.judge.preflight = False
  first, last = args.warmup, args.warmup + args.steps
  marks, calls, waits, window = {}, {"n": 0}, [], {}
  annotation = jax.profiler.TraceAnnotation("rl_window")

  def mark(step: int) -> None:
    if step == first:
      options = jax.profiler.ProfileOptions()
      options.python_tracer_level = 0
      jax.profiler.start_trace(trace_dir, profiler_options=options)
      annotation.__enter__()
      marks["t0"], window["open"] = time.perf_counter(), True
    elif step == last:
      marks["t1"], window["open"] = time.perf_counter(), False
      annotation.__exit__(None, None, None)
      jax.profiler.stop_trace()

  update_call, reward_call, submit = RLUpdate.__call__, caprl.CapRLReward.__call__, RolloutSource.submit

  def marked_update(self, *a, **kw):
    mark(calls["n"])
    calls["n"] += 1
    return update_call(self, *a, **kw)

  def slow_reward(self, *a, **kw):
    time.sleep(latency_ms / 1e3)
    return reward_call(self, *a, **kw)

  def timed_submit(self, *a, **kw):
    return _TimedFuture(submit(self, *a, **kw), waits, window)

  from jaxcap.sampling.engine import PagedSampler

  paged_call, rollouts = PagedSampler.__call__, {"n": 0}

  def capped(self, prompts, key, *, num_samples=1, max_lengths=None, **kw):
    if args.length_spread and max_lengths is None:
      rng = np.random.default_rng([7, rollouts["n"]])
      rollouts["n"] += 1
      caps = rng.integers(args.length_spread, args.new_tokens + 1, size=prompts.block)
      max_lengths = np.repeat(caps, num_samples)
    return paged_call(self, prompts, key, num_samples=num_samples, max_lengths=max_lengths, **kw)

  paged_rounds = PagedSampler.rounds

  def capped_rounds(self, feed, key, *, num_samples=1, **kw):  # partial rollouts: the window's rows at once
    if args.length_spread:
      rng = np.random.default_rng([7, rollouts["n"]])
      rollouts["n"] += 1
      caps = rng.integers(args.length_spread, args.new_tokens + 1, size=sum(feed.blocks))
      kw["max_lengths"] = np.repeat(caps, num_samples)
    return paged_rounds(self, feed, key, num_samples=num_samples, **kw)

  # the rollout side's idle time: between its rollouts (a rollout thread) or waiting on the loop for a round or a
  # version (partial rollouts), clipped to the window
  from jaxcap.train.rollouts.partial import RoundFeed

  generate, feed_wait, busy, idle = RolloutSource.generate, RoundFeed._wait, [], []
  RolloutSource.generate, RoundFeed._wait = _spans(generate, busy), _spans(feed_wait, idle)
  RLUpdate.__call__, RolloutSource.submit, PagedSampler.__call__ = marked_update, timed_submit, capped
  PagedSampler.rounds = capped_rounds
  if judge_url is None:
    caprl.CapRLReward.__call__ = slow_reward
  try:
    loop.Trainer(validate(config)).run()
  finally:
    RLUpdate.__call__, RolloutSource.submit, caprl.CapRLReward.__call__ = update_call, submit, reward_call
    PagedSampler.__call__, PagedSampler.rounds = paged_call, paged_rounds
    RolloutSource.generate, RoundFeed._wait = generate, feed_wait
  wall = marks["t1"] - marks["t0"]
  path = sorted(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True))[-1]
  busy_ns, _, what = device_busy_ns(path, _window_ns(path, "rl_window"))
  rows = [json.loads(line) for line in (Path(workdir) / "metrics.jsonl").read_text().splitlines()]
  rl = [r for r in rows if r.get("phase") == "rl" and "loss" in r]
  timed = [r for r in rl if first < r["step"] <= last]  # the window's steps (metrics.jsonl numbers them from 1)
  learner_wait = sum(waits) + sum(r.get("async/learner_wait_s", 0.0) for r in timed)
  split = rollout_devices(arm) > 0
  clip = lambda spans: sum(max(0.0, min(b, marks["t1"]) - max(a, marks["t0"])) for a, b in spans)
  rollout_idle = clip(idle) / wall if partial else 1 - clip(busy) / wall
  return {
    "steps_per_s": args.steps / wall,
    "s_per_step": wall / args.steps,
    "device_busy_fraction": busy_ns / 1e9 / wall,
    "judge_wait_s": sum(waits) / args.steps,
    # the loop blocked on a round's rollout or its rewards: an upper bound of the learner's idle share (its last
    # dispatched passes may still be running then); colocated, the learner's devices also roll out
    "learner_idle_fraction": learner_wait / wall,
    # split arms: the share of the window the rollout devices were not rolling out (between rollouts, or
    # partial rollouts' engine waiting on the loop for a round or a version)
    "rollout_idle_fraction": rollout_idle if split else None,
    "staleness": [r.get("async/staleness") for r in rl],
    "valid_fraction": [r.get("judge/valid_fraction") for r in rl],
    "device": what,
    "load_average": os.getloadavg(),
  }
