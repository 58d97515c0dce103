"""Asynchronous RL (`rl.max_staleness` = k >= 1): the rounds of the next k steps are rolled out and judged while
the learner updates.

    schedule = FullyAsync(steps, checkpoint_every, k, sync)   # the rollout source's schedule
    loader = schedule.attach(loader)                           # an `Ahead`: batches drawn up to k steps early

The version rule. Version v is the phase's weights after v updates. Step s trains on round s, rolled out from
version max(w, s - k), w the first step of its window (the phase's first step, or the step after a checkpoint).
At step s the learner publishes version s and queues every round of the window up to s + k (each one's version
is then published), then waits for round s. Which weights roll out which round reads only the config, so a run is
the same whatever the timing and on any device split, and a resumed run repeats the uninterrupted one: no round
is queued across a checkpoint (nor past the phase's last step), so nothing of the queue is saved.

Where rounds are rolled out (`sync`, `jaxcap.train.rollouts.placement`):
  colocated (rollout.devices = 0)   on the learner's devices, by the loop itself before it dispatches the update
                                    (the paged engine's host loop then runs before the update; the judge still
                                    overlaps it); the published version is the state's own params, used before
                                    the update donates them
  disaggregated (rollout.devices)   on the rollout devices, by a rollout thread that never waits for the learner
                                    while it has rounds queued; versions are device-to-device copies
                                    (`WeightSync.publish`), and a round's arrays are copied to the learner's mesh
                                    when its step takes it

The update's ratio is against the old log-probs recomputed with the current weights (or the sampler's,
`rl.recompute_old_logprobs` False); the sampler's log-probs are the behaviour policy's, for the rollout correction
(`rl.rollout_correction`: TIS / MIS / rejection) and the `rollout_corr/*` metrics. Logged per step: async/staleness
(updates between the round's weights and this step's), async/queued (rounds queued beyond this one),
async/ready (of those, rolled out already), async/version_gap (this step's version minus the newest version a
round is being rolled out from now), async/learner_wait_s (the loop waiting for the round's rollout),
time/rollout_s (the round's rollout) and time/judge_wait_s (the learner waiting for its rewards).
"""

from __future__ import annotations

import collections
import dataclasses
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import jax
import numpy as np

from jaxcap.train.rollouts.loader import Ahead
from jaxcap.train.rollouts.partial import PartialRounds, token_staleness
from jaxcap.train.rollouts.round import JudgedRound


def window_end(step: int, steps: int, checkpoint_every: int) -> int:
  """The end (exclusive) of 0-based step `step`'s window in a phase of `steps` steps checkpointed every
  `checkpoint_every` (the loop saves after step s when (s + 1) % every == 0, and after the last)."""
  if not checkpoint_every:
    return steps
  return min(steps, (step // checkpoint_every + 1) * checkpoint_every)


def rollout_version(r: int, window_start: int, max_staleness: int) -> int:
  """The version (updates of the phase) that rolls out round `r` of the window starting at `window_start`."""
  return max(window_start, r - max_staleness)


class _Inline:
  """An executor that runs each job as it is submitted, on the caller's thread (colocated rollouts)."""

  def submit(self, fn, *args) -> Future:
    future: Future = Future()
    try:
      future.set_result(fn(*args))
    except BaseException as e:  # raised where the step takes the round, as a thread's would be
      future.set_exception(e)
    return future

  def shutdown(self, **kw) -> None:
    pass


@dataclasses.dataclass
class _Job:
  version: int
  future: Future


@dataclasses.dataclass
class FullyAsync:
  """The rollout source's schedule with rl.max_staleness = `max_staleness` (see the module docstring), for a phase
  of `steps` steps checkpointed every `checkpoint_every`. `sync`: a `WeightSync` onto the rollout devices (a
  thread rolls out there), or None (colocated: the loop rolls out)."""

  steps: int
  checkpoint_every: int
  max_staleness: int
  sync: Any = None  # jaxcap.train.rollouts.placement.WeightSync, or None: colocated
  partial: bool = False  # rl.partial_rollouts: a window's rounds through one engine stream (rollouts.partial)
  thread: bool | None = None  # a rollout thread (default: with `sync`); colocated partial rollouts sync inline

  def __post_init__(self):
    if self.max_staleness < 1:
      raise ValueError(f"rl.max_staleness={self.max_staleness}: the asynchronous schedule needs at least 1")
    if self.thread is None:
      self.thread = self.sync is not None
    if self.partial and self.sync is None:
      raise ValueError("partial rollouts hold versions across steps: give the schedule a WeightSync")
    self._reset()

  def _reset(self) -> None:
    self._loader: Ahead | None = None
    self._window: tuple[int, int] | None = None
    self._queued = 0  # the next round to queue
    self._jobs: dict[int, _Job] = {}
    self._unjudged: collections.deque = collections.deque()  # colocated: (Generated, step) not judged yet
    self._generating = -1  # the version of the round being rolled out now (async/version_gap)
    self._executor = ThreadPoolExecutor(1, thread_name_prefix="rollouts") if self.thread else _Inline()
    self._rounds: PartialRounds | None = None  # partial rollouts: the window's engine stream
    self._offered = 0

  def attach(self, loader):
    self.close()
    self._reset()  # a resumed or new phase starts with an empty queue
    self._loader = Ahead(loader, on_close=self.close)
    return self._loader

  def close(self) -> None:
    """Stops the rollout thread: queued rounds not started are dropped, one being rolled out is left to finish."""
    executor = getattr(self, "_executor", None)
    if executor is not None:
      executor.shutdown(wait=False, cancel_futures=True)
    rounds = getattr(self, "_rounds", None)
    if rounds is not None:
      rounds.close()

  def round(self, source, state, batch, step: int, key: jax.Array) -> JudgedRound:
    if self.partial:
      return self._partial_round(source, state, batch, step)
    k = self.max_staleness
    if self._window is None or step >= self._window[1]:
      if self._jobs:
        raise RuntimeError(f"rounds {sorted(self._jobs)} still queued at the start of a window (step {step})")
      self._window, self._queued = (step, window_end(step, self.steps, self.checkpoint_every)), step
    start, end = self._window
    last = min(step + k, end - 1)
    if self._queued <= last:  # this step's version rolls out rounds: publish it
      weights = state.params if self.sync is None else self.sync.publish(state.params)
      while self._queued <= last:
        r = self._queued
        b = batch if r == step else self._peek(r - step)
        version = rollout_version(r, start, k)
        rkey = key if r == step else jax.random.fold_in(state.key, r)
        job = self._executor.submit(self._generate, source, weights, b, rkey, r, version, r == step)
        self._jobs[r] = _Job(version, job)
        self._queued += 1
    t0 = time.perf_counter()
    job = self._jobs.pop(step)
    gen, placed = job.future.result()
    waited = time.perf_counter() - t0
    if gen.batch is not batch:
      raise RuntimeError("asynchronous queue out of step with the loader: bind its Ahead with RolloutSource.attach")
    rnd = source.lay_out(gen, source.sampler.place(batch.prompts) if placed is None else placed)
    metrics = {
      "async/staleness": float(step - job.version),
      "async/queued": float(len(self._jobs)),
      "async/ready": float(sum(j.future.done() for j in self._jobs.values())),
      "async/version_gap": float(step - max(self._generating, job.version)),
      "async/learner_wait_s": waited,
      "time/rollout_s": gen.seconds,
    }

    return self._judged(source, rnd, metrics)

  def _partial_round(self, source, state, batch, step: int) -> JudgedRound:
    """Round `step` from the window's engine stream (`jaxcap.train.rollouts.partial`)."""
    k = self.max_staleness
    if self._window is None or step >= self._window[1]:
      if self._rounds is not None:
        self._rounds.close()
      start, end = self._window = (step, window_end(step, self.steps, self.checkpoint_every))
      key = jax.random.fold_in(state.key, start)
      block = batch.prompts.block
      self._rounds = PartialRounds(source, start, end, k, key, self.sync.mesh, block, self.thread)
      self._offered = step
    start, end = self._window
    if step == start or step <= end - k:  # a version some round of the window runs with
      self._rounds.publish(step, self.sync.publish(state.params))
    while self._offered <= min(step + k, end - 1):
      r = self._offered
      self._rounds.offer(r, batch if r == step else self._peek(r - step))
      self._offered += 1
    t0 = time.perf_counter()
    gen, versions = self._rounds.take(step)
    waited = time.perf_counter() - t0
    if gen.batch is not batch:
      raise RuntimeError("partial rollouts out of step with the loader: bind its Ahead with RolloutSource.attach")
    rnd = source.lay_out(gen, source.sampler.place(batch.prompts))
    mean, worst = token_staleness(versions, np.asarray(gen.rollouts.arrays.lengths), step)
    results = [self._rounds.results[r] for r in range(step + 1, self._offered)]
    metrics = {
      "async/staleness": mean,
      "async/staleness_max": worst,
      "async/queued": float(len(results)),
      "async/ready": float(sum(f.done() for f in results)),
      "async/learner_wait_s": waited,
      "time/rollout_s": gen.seconds,
    }

    return self._judged(source, rnd, metrics)

  def _judged(self, source, rnd, metrics: dict) -> JudgedRound:
    """The round with its rewards' wait (time/judge_wait_s added to `metrics`)."""

    def rewards():  # called once this step's log-prob passes are dispatched
      while self._unjudged:  # colocated: the rounds queued ahead go to the judge now, while the passes run
        ahead, r = self._unjudged.popleft()
        ahead.judging = source.submit(ahead, r)
      t1 = time.perf_counter()
      rnd.rewards = rnd.judging.result()
      source.settle()
      metrics["time/judge_wait_s"] = time.perf_counter() - t1
      return rnd.rewards.values, rnd.rewards.valid

    return JudgedRound.of(rnd, rewards, metrics)

  def _peek(self, n: int):
    if self._loader is None:
      raise RuntimeError("the asynchronous schedule has no loader: bind it with RolloutSource.attach")
    return self._loader.peek(n)

  def _generate(self, source, params, batch, key, step: int, version: int, now: bool):
    """Round `step` rolled out from `params` (version `version`) and handed to the judge: (Generated, its prompts
    placed on the learner's mesh or None). On the rollout thread under the rollout mesh, or inline (colocated: a
    round queued ahead, `now` False, goes to the judge after this step's passes are dispatched, since handing its
    captions over waits for its rollout to finish)."""
    self._generating = version
    if self.sync is None:  # inline, under the loop's mesh: the prompts placed once, for the rollout and the update
      placed = source.sampler.place(batch.prompts)
      gen = source.generate(params, batch, key, step, placed)
    else:
      placed = None
      with jax.set_mesh(self.sync.mesh):
        gen = source.generate(params, batch, key, step)
    if gen.judging is None and (now or self.sync is not None):
      gen.judging = source.submit(gen, step)
    elif gen.judging is None:
      self._unjudged.append((gen, step))
    return gen, placed
