"""The judge failure budget: a run whose judge keeps failing stops with the reasons counted, instead of training
on masked rewards (loss 0, no signal) and exiting 0.

    reward = judged_reward(reward, judge, config.judge)    # raises JudgeFailureBudgetError from the reward call

Per RL step the budget reads how many judgments the judge tried and how many of those failed, by kind (the
judge's cumulative `judgment_counts()`; HttpJudge and RuleBasedJudge keep them). A judgment that was never sent
(every endpoint's breaker open through a probe: `unsent_judgments()`) is masked and logged, but is no failure of
the judge's answers, so it is left out of the share. When the share of valid judgments stays below
`judge.min_valid_fraction` for `judge.failure_patience` consecutive steps, it raises. Several calls in one step (dynamic sampling's refill
rounds) count as one step of the streak. A step that tried no
judgment (e.g. no image had questions) neither counts against the budget nor resets it. Steps are numbered as
metrics.jsonl numbers them, from 1.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from jaxcap.data.records import ImageRecord
from jaxcap import multihost
from jaxcap.rewards.stage import RewardStage

KINDS = ("auth", "timeout", "connection", "http_status", "parse")  # always listed, in this order
HINTS = {
  "auth": "check the API key (export the variable judge.api_key_env names, with the key the servers were started with)",
  "timeout": "the fleet is overloaded or hung: add endpoints, lower judge.max_concurrency or raise judge.timeout_s",
  "connection": "the servers are down or unreachable: check judge.endpoints and the servers' logs",
  "http_status": "the servers refuse the requests: see the messages in their logs",
  "parse": "the replies do not parse: check judge.model and judge.structured_output",
  "image": "images could not be attached: check the manifest's image paths",
  "refused": "the judge refused the judgments",
}


class JudgeFailureBudgetError(RuntimeError):
  """Too few valid judgments for too many consecutive steps; the message counts the failures by kind."""


class FailureBudget:
  """Raises JudgeFailureBudgetError once the share of valid judgments has been below `min_valid_fraction` for
  `patience` consecutive steps (min_valid_fraction 0 turns the check off)."""

  def __init__(self, min_valid_fraction: float = 0.5, patience: int = 3):
    if not 0.0 <= float(min_valid_fraction) <= 1.0:
      raise ValueError(
        f"judge.min_valid_fraction={min_valid_fraction}: must be in [0, 1] (share of valid judgments per step; "
        "0 turns the failure budget off)."
      )
    if int(patience) < 1 or int(patience) != patience:
      raise ValueError(f"judge.failure_patience={patience}: must be an integer >= 1 (consecutive RL steps).")
    self.min_valid_fraction = float(min_valid_fraction)
    self.patience = int(patience)
    self._reset()

  def _reset(self) -> None:
    self.bad_steps: list[int] = []
    self.asked = self.failed = self.unsent = 0
    self.by_kind: collections.Counter[str] = collections.Counter()

  def observe(
    self,
    step: int,
    asked: int,
    failed: int,
    by_kind: Mapping[str, int] | None = None,
    last_error: str = "",
    unsent: int = 0,
  ) -> float:
    """Records step `step`'s judgments (numbered as metrics.jsonl numbers steps, from 1): `asked` tried, `failed`
    of them failed, `unsent` more never sent; returns its valid share (NaN when none was tried). Raises when the
    budget is spent."""
    if asked <= 0:
      return float("nan")
    valid = (asked - failed) / asked
    if valid >= self.min_valid_fraction:
      self._reset()
      return valid
    if not self.bad_steps or self.bad_steps[-1] != int(step):  # a step's refill rounds (rl.filter_groups) are one step
      self.bad_steps.append(int(step))
    self.asked += asked
    self.failed += failed
    self.unsent += unsent
    self.by_kind.update({k: int(v) for k, v in (by_kind or {}).items() if v})
    if len(self.bad_steps) >= self.patience:
      raise JudgeFailureBudgetError(self.message(last_error))
    return valid

  def message(self, last_error: str = "") -> str:
    steps = self.bad_steps
    counted = sum(self.by_kind.values())
    kinds = {k: self.by_kind.get(k, 0) for k in KINDS}
    kinds.update({k: v for k, v in sorted(self.by_kind.items()) if k not in KINDS})
    if counted < self.failed:
      kinds["unclassified"] = self.failed - counted
    listed = ", ".join(f"{k} {v}" for k, v in kinds.items())
    main = max(kinds, key=kinds.get) if self.failed else ""
    text = (
      f"Judge failure budget spent: valid judgments stayed below judge.min_valid_fraction="
      f"{self.min_valid_fraction:g} for {len(steps)} consecutive RL steps (steps {steps[0]}-{steps[-1]}: "
      f"{self.asked - self.failed} of {self.asked} judgments valid"
      + (f"; {self.unsent} more not sent, every endpoint's breaker open" if self.unsent else "")
      + f"); stopping instead of training on masked rewards. Failed judgments by kind: {listed}."
    )
    if main in HINTS:
      text += f" Most are {main}: {HINTS[main]}."
    if last_error:
      text += f" Last error: {last_error[:300].rstrip('. ')}."
    return (
      text + " To tolerate more failures, lower judge.min_valid_fraction (0 = off) or raise judge.failure_patience."
    )


def judgment_counts(judge: Any) -> tuple[int, int, dict[str, int]] | None:
  """The judge's cumulative (asked, failed, failed by kind), or None when it does not keep them."""
  counts = getattr(judge, "judgment_counts", None)
  return counts() if callable(counts) else None


def unsent_judgments(judge: Any) -> int:
  """The judge's cumulative failed judgments that were never sent (0 for judges that send nothing)."""
  unsent = getattr(judge, "unsent_judgments", None)
  return int(unsent()) if callable(unsent) else 0


class BudgetedReward(RewardStage):
  """A reward function whose every call feeds the failure budget with the judgments it cost; same `names`. Each
  batch's `extras` (logged with the step's metrics) gain judge/valid_fraction (NaN when nothing was tried),
  judge/failed/<kind> for this call's failed judgments and judge/unsent for those never sent. `step` is the
  loop's 0-based step index; the budget reports step + 1, the number metrics.jsonl gives it."""

  def __init__(self, reward_fn: Any, judge: Any, budget: FailureBudget):
    super().__init__(reward_fn)
    self.judge = judge
    self.budget = budget
    self.last_valid_fraction = float("nan")
    # with several processes, each call's counts until `settle` agrees them; a FIFO, since with
    # rl.max_staleness the next steps' calls may finish before this step's settle
    self._pending: collections.deque[tuple] = collections.deque()

  def settle(self) -> None:
    """With several processes: feeds the budget every process's judgments of the oldest unsettled call, summed (a
    small host all-gather, so call it on the loop's thread after the step's rewards, on every process): all
    processes then stop at the same step, with the same counts. A no-op with one process (the call itself fed the
    budget)."""
    if not self._pending:
      return super().settle()
    step, asked, failed, kinds, last, unsent = self._pending.popleft()
    names = (*KINDS, *(k for k in HINTS if k not in KINDS), "unclassified")
    local = [asked, failed, unsent, *(int(kinds.get(k, 0)) for k in names)]
    total = np.sum(multihost.allgather_ints(np.asarray(local, np.int64)), axis=0)
    by_kind = dict(zip(names, total[3:].tolist()))
    self.budget.observe(step + 1, int(total[0]), int(total[1]), by_kind, last, unsent=int(total[2]))
    super().settle()

  def open(self) -> tuple:
    """The judge's counts before the call."""
    return judgment_counts(self.judge), unsent_judgments(self.judge)

  def complete(self, batch, captions: Sequence[str], records: Sequence[ImageRecord], *, step: int, opened: tuple):
    before, unsent_before = opened
    after, unsent = judgment_counts(self.judge), unsent_judgments(self.judge) - unsent_before
    if before is not None and after is not None:
      asked, failed = after[0] - before[0], after[1] - before[1]
      kinds = {k: v - before[2].get(k, 0) for k, v in after[2].items()}
    else:  # a judge that keeps no counts: masked reward entries stand in for failed judgments
      asked, failed = int(batch.valid.size), int((~batch.valid).sum())
      kinds = {"unclassified": failed} if failed else {}
    last = getattr(self.judge, "last_failure", None)
    last = last() if callable(last) else ""
    if jax.process_count() > 1:  # every process must stop at the same step: counts agreed in `settle`
      self._pending.append((step, asked, failed, kinds, last, unsent))
      self.last_valid_fraction = (asked - failed) / asked if asked > 0 else float("nan")
    else:
      self.last_valid_fraction = self.budget.observe(step + 1, asked, failed, kinds, last, unsent=unsent)
    extras = {"judge/valid_fraction": self.last_valid_fraction, "judge/unsent": float(unsent)}
    extras.update({f"judge/failed/{k}": 0.0 for k in KINDS})
    extras.update({f"judge/failed/{k}": float(v) for k, v in kinds.items() if v})
    return dataclasses.replace(batch, extras={**batch.extras, **extras})


def judged_reward(reward_fn: Any, judge: Any, config: Mapping[str, Any]) -> BudgetedReward:
  """`reward_fn` under the failure budget the judge config sets (min_valid_fraction, failure_patience; a floor of
  0 never stops the run but still logs the failures by kind)."""
  budget = FailureBudget(float(config.min_valid_fraction), int(config.failure_patience))
  return BudgetedReward(reward_fn, judge, budget)
