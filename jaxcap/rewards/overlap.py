"""Judging off the training loop's critical path: submit step t's rollouts, collect the rewards later.

The training loop calls `submit(captions, records, step=t)` as soon as step t's captions are decoded and keeps
the device busy (the policy update of step t-1, the rollouts of step t+1); `Future.result()` blocks only
when the rewards are needed. With a judge slower than the device the step time becomes max(device, judge)
instead of device + judge (benchmarks/judge_overlap.py measures the ratio).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Sequence

from jaxcap.rewards.batch import RewardBatch, RewardFunction
from jaxcap.rewards.stage import RewardStage
from jaxcap.data.records import ImageRecord


class OverlappedReward(RewardStage):
  """A reward function run on host worker threads; `max_in_flight` steps may be judged at once.

  The reward code is unchanged (it blocks on the judge); only the thread it blocks is not the loop's.
  JAX dispatch is asynchronous, so device work enqueued before `result()` runs meanwhile.
  """

  def __init__(self, reward_fn: RewardFunction, *, max_in_flight: int = 1):
    if max_in_flight < 1:
      raise ValueError(f"max_in_flight={max_in_flight}: must be >= 1.")
    super().__init__(reward_fn)
    self._pool = ThreadPoolExecutor(max_workers=max_in_flight, thread_name_prefix="reward")

  def submit(self, captions: Sequence[str], records: Sequence[ImageRecord], *, step: int = 0) -> Future:
    """Future[RewardBatch] of `reward_fn(captions, records, step=step)`; inputs are copied first."""
    return self._pool.submit(self.inner, list(captions), list(records), step=step)

  def __call__(self, captions: Sequence[str], records: Sequence[ImageRecord], *, step: int = 0) -> RewardBatch:
    """Blocking call, so an OverlappedReward is also a plain RewardFunction."""
    return self.submit(captions, records, step=step).result()

  def close(self) -> None:
    self._pool.shutdown(wait=True)
    super().close()

  def __enter__(self) -> "OverlappedReward":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
