"""Streaming judging: a step's captions judged group by group as the rollout engine finishes them, so the judge
works while decoding continues.

    stream = reward.stream(records, group_size=G, step=t)   # OverlappedReward: before the rollout starts
    stream.add(b, captions)                                # from the engine, when prompt b's G samples are done
    rewards = stream.result()                              # the step's RewardBatch, B*G rows in prompt order

Each group goes through the innermost reward function (`RewardStage.core`, its captions keyed by their place in
the step's batch) on a pool of group workers as it arrives; once every group is in, the parts are stacked in
prompt order and the stages complete the batch once (`RewardStage.finish`: the length mask, the overlong penalty,
the failure budget), so the batch equals one call's on the whole step. Streams run one at a time, in the order they
were opened (as `OverlappedReward.submit`'s calls do): the failure budget counts exactly one step's judgments, and
a stream opened while another is judged only queues its groups.
"""

from __future__ import annotations

import queue
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Sequence

from jaxcap.data.records import ImageRecord
from jaxcap.rewards.batch import RewardBatch, stack_rows
from jaxcap.rewards.stage import RewardStage

_CANCEL = object()


class StreamCancelled(RuntimeError):
  """The rollout feeding a stream stopped before every group arrived."""


class GroupStream:
  """The rewards of one step's B groups of `group_size` captions (records [B], one per prompt), judged as they come;
  `future` holds the RewardBatch once every group was added."""

  def __init__(
    self,
    stage: RewardStage,
    records: Sequence[ImageRecord],
    *,
    group_size: int,
    step: int,
    serial: ThreadPoolExecutor,
    workers: ThreadPoolExecutor,
  ):
    self.stage, self.records, self.group_size, self.step = stage, list(records), int(group_size), int(step)
    self.added = 0  # groups handed over so far
    self._workers = workers
    self._inbox: queue.SimpleQueue = queue.SimpleQueue()
    self.future: Future = serial.submit(self._judge)

  def add(self, index: int, captions: Sequence[str]) -> None:
    """Prompt `index`'s G captions (its samples in order); each group is added once."""
    if len(captions) != self.group_size:
      raise ValueError(f"group {index}: {len(captions)} captions, expected {self.group_size}")
    self.added += 1
    self._inbox.put((int(index), list(captions)))

  def cancel(self) -> None:
    """Ends a stream whose rollout failed: its future raises StreamCancelled (and the next stream may start)."""
    self._inbox.put(_CANCEL)

  def result(self) -> RewardBatch:
    return self.future.result()

  def _judge(self) -> RewardBatch:
    begun = self.stage.begin()
    n, g = len(self.records), self.group_size
    parts: dict[int, Future] = {}
    captions: dict[int, list[str]] = {}
    while len(parts) < n:
      item = self._inbox.get()
      if item is _CANCEL:
        for f in parts.values():
          f.cancel()
        raise StreamCancelled(f"the rollout of step {self.step} stopped after {len(parts)} of {n} groups")
      b, caps = item
      if b in parts or not 0 <= b < n:
        raise ValueError(f"group {b} added twice or out of range (B={n})")
      captions[b] = caps
      parts[b] = self._workers.submit(self.stage.core, caps, [self.records[b]], step=self.step, first=b * g)
    batch = stack_rows([parts[b].result() for b in range(n)])
    whole = [c for b in range(n) for c in captions[b]]
    return self.stage.finish(batch, whole, self.records, step=self.step, begun=begun)
