"""Judging off the training loop's critical path: submit step t's rollouts, collect the rewards later.

The training loop calls `submit(captions, records, step=t)` as soon as step t's captions are decoded and keeps
the device busy (the policy update of step t-1, the rollouts of step t+1); `Future.result()` blocks only
when the rewards are needed. With a judge slower than the device the step time becomes max(device, judge)
instead of device + judge (benchmarks/judge_overlap.py measures the ratio). `stream(...)` judges a step's groups
as the rollout engine finishes them (jaxcap.rewards.streaming).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Sequence

from jaxcap.rewards.batch import RewardBatch, RewardFunction
from jaxcap.rewards.stage import RewardStage
from jaxcap.rewards.streaming import GroupStream
from jaxcap.data.records import ImageRecord


class OverlappedReward(RewardStage):
  """A reward function run on host worker threads; `max_in_flight` steps may be judged at once, and a streamed
  step's groups on up to `group_workers` threads at once.

  The reward code is unchanged (it blocks on the judge); only the thread it blocks is not the loop's.
  JAX dispatch is asynchronous, so device work enqueued before `result()` runs meanwhile.
  """

  def __init__(self, reward_fn: RewardFunction, *, max_in_flight: int = 1, group_workers: int = 8):
    if max_in_flight < 1 or group_workers < 1:
      raise ValueError(f"max_in_flight={max_in_flight}, group_workers={group_workers}: each must be >= 1.")
    super().__init__(reward_fn)
    self._pool = ThreadPoolExecutor(max_workers=max_in_flight, thread_name_prefix="reward")
    self._group_workers = group_workers
    self._groups: ThreadPoolExecutor | None = None  # started by the first stream

  def submit(self, captions: Sequence[str], records: Sequence[ImageRecord], *, step: int = 0) -> Future:
    """Future[RewardBatch] of `reward_fn(captions, records, step=step)`; inputs are copied first."""
    return self._pool.submit(self.inner, list(captions), list(records), step=step)

  def stream(self, records: Sequence[ImageRecord], *, group_size: int, step: int = 0) -> GroupStream:
    """A stream of `records`' groups (G = `group_size` captions each) to add as they finish; its result equals
    `submit(all captions, records, step=step)`'s. Streams and submitted calls share the one-at-a-time order."""
    if self._groups is None:
      self._groups = ThreadPoolExecutor(max_workers=self._group_workers, thread_name_prefix="reward-group")
    return GroupStream(self, records, group_size=group_size, step=step, serial=self._pool, workers=self._groups)

  def __call__(
    self, captions: Sequence[str], records: Sequence[ImageRecord], *, step: int = 0, first: int = 0
  ) -> RewardBatch:
    """Blocking call, so an OverlappedReward is also a plain RewardFunction."""
    if first:
      return super().__call__(captions, records, step=step, first=first)
    return self.submit(captions, records, step=step).result()

  def close(self) -> None:
    self._pool.shutdown(wait=True)
    if self._groups is not None:
      self._groups.shutdown(wait=True)
    super().close()

  def __enter__(self) -> "OverlappedReward":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
