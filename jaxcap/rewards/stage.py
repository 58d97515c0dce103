"""The protocol every reward wrapper shares: a `RewardStage` is a reward function around another (`inner`), with
the same reward `names`, that closes and settles through to it. The run's reward is a chain of stages
(`jaxcap.rewards.pipeline`), and whoever holds the outer one talks to it alone, never to a stage further in."""

from __future__ import annotations

from typing import Sequence

from jaxcap.data.records import ImageRecord
from jaxcap.rewards.batch import RewardBatch, RewardFunction


class RewardStage:
  """A reward function around `inner`; subclasses override `__call__`, and `settle` / `close` when they hold
  something of their own (calling the base's after theirs)."""

  def __init__(self, inner: RewardFunction):
    self.inner = inner
    self.names = inner.names

  def __call__(self, captions: Sequence[str], records: Sequence[ImageRecord], *, step: int = 0) -> RewardBatch:
    return self.inner(captions, records, step=step)

  def settle(self) -> None:
    """Agrees what the last call left pending across processes (e.g. the judge failure budget); call it on the
    loop's thread after each step's rewards, on every process."""
    settle = getattr(self.inner, "settle", None)
    if settle is not None:
      settle()

  def close(self) -> None:
    """Stops what the stages hold (worker threads); safe to call twice."""
    close = getattr(self.inner, "close", None)
    if close is not None:
      close()
