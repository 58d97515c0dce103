"""The protocol every reward wrapper shares: a `RewardStage` is a reward function around another (`inner`), with
the same reward `names`, that closes and settles through to it. The run's reward is a chain of stages
(`jaxcap.rewards.pipeline`), and whoever holds the outer one talks to it alone, never to a stage further in.

A stage's own work is split around its inner call: `open()` before it (e.g. the judge's counts the failure budget
differences), `complete(batch, ...)` after it. A call is then `begin()` (every stage's `open`, outer first) ->
`core(...)` (the innermost reward function) -> `finish(...)` (every stage's `complete`, inner first), which lets
streaming judging (`jaxcap.rewards.streaming`) score a batch's groups through `core` as they come and complete
the assembled batch once, exactly as one call would.
"""

from __future__ import annotations

from typing import Any, Sequence

from jaxcap.data.records import ImageRecord
from jaxcap.rewards.batch import RewardBatch, RewardFunction, positioned


class RewardStage:
  """A reward function around `inner`; subclasses override `open` / `complete` (their work before / after the
  inner call), and `settle` / `close` when they hold something of their own (calling the base's after theirs)."""

  def __init__(self, inner: RewardFunction):
    self.inner = inner
    self.names = inner.names

  def __call__(
    self, captions: Sequence[str], records: Sequence[ImageRecord], *, step: int = 0, first: int = 0
  ) -> RewardBatch:
    begun = self.begin()
    batch = self.core(captions, records, step=step, first=first)
    return self.finish(batch, captions, records, step=step, begun=begun)

  # -- a stage's own work ------------------------------------------------------------------------------------

  def open(self) -> Any:
    """Runs before the inner call; what it returns reaches this stage's `complete`."""
    return None

  def complete(
    self, batch: RewardBatch, captions: Sequence[str], records: Sequence[ImageRecord], *, step: int, opened: Any
  ) -> RewardBatch:
    """This stage's batch from its inner reward's `batch` of the same captions."""
    return batch

  # -- the chain, for callers that split a call (streaming judging) --------------------------------------------

  def begin(self) -> tuple:
    """Every stage's `open`, outermost first (as nested calls run them)."""
    return self.open(), (self.inner.begin() if isinstance(self.inner, RewardStage) else None)

  def core(
    self, captions: Sequence[str], records: Sequence[ImageRecord], *, step: int = 0, first: int = 0
  ) -> RewardBatch:
    """The innermost reward function's batch of `captions` (`first`: the index of captions[0] in the step's
    batch, for rewards whose draws are keyed by it)."""
    if isinstance(self.inner, RewardStage):
      return self.inner.core(captions, records, step=step, first=first)
    return self.inner(captions, records, step=step, **positioned(first))

  def finish(
    self, batch: RewardBatch, captions: Sequence[str], records: Sequence[ImageRecord], *, step: int, begun: tuple
  ) -> RewardBatch:
    """Every stage's `complete` of the innermost reward's `batch`, innermost first; `begun` from `begin`."""
    opened, inner = begun
    if isinstance(self.inner, RewardStage):
      batch = self.inner.finish(batch, captions, records, step=step, begun=inner)
    return self.complete(batch, captions, records, step=step, opened=opened)

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
