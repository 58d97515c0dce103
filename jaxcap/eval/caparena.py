"""CapArena-style evaluation: pairwise battles against baseline captions, both orders, ties allowed.

Each image is judged twice per baseline, candidate first (as "a") and baseline first (position swap), so a
judge's position bias cancels. Each valid verdict is a battle: win (+1), tie (0) or loss (-1) for the
candidate. Per baseline, over all valid battles:
    caparena/<baseline>/score    = 100 * (wins - losses) / battles        in [-100, 100]
    caparena/<baseline>/win_rate = 100 * wins / battles
(CapArena-Auto's (wins - losses) / 2 over 200 battles is this formula.) caparena/score and caparena/win_rate
average the baselines, as CapArena-Auto averages its three. Failed verdicts are masked and counted.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np

from jaxcap.eval.captioners import CaptionSet
from jaxcap.eval.metrics import RatioMetric, SuiteResult
from jaxcap.judges.protocol import Judge, PairwiseRequest
from jaxcap.data.records import ImageRecord


@dataclasses.dataclass(frozen=True)
class CapArenaConfig:
  with_reference: bool = True  # show the judge the human/reference caption, as CapArena-Auto does


def battle_outcome(winner: str, candidate_position: str) -> int:
  """+1 if the candidate won, 0 on a tie, -1 if it lost; `winner` and position are "a", "b" or "tie"."""
  if winner not in ("a", "b", "tie"):
    raise ValueError(f"Pairwise winner {winner!r}: the judge must answer 'a', 'b' or 'tie'.")
  return 0 if winner == "tie" else (1 if winner == candidate_position else -1)


def run_caparena(
  judge: Judge,
  records: Sequence[ImageRecord],
  candidate: CaptionSet,
  baselines: Mapping[str, CaptionSet],
  config: CapArenaConfig = CapArenaConfig(),
) -> SuiteResult:
  """CapArena metrics of `candidate` against every baseline, over `records` [N], first caption per image."""
  if not baselines:
    raise ValueError("CapArena needs at least one baseline captioner (config caparena.baselines).")
  mine = candidate.first(records)
  requests, keys = [], []  # key: (baseline, image index, candidate position)
  for name, baseline in baselines.items():
    for i, (record, theirs) in enumerate(zip(records, baseline.first(records))):
      reference = record.reference_caption if config.with_reference else ""
      requests.append(PairwiseRequest(record.id, mine[i], theirs, reference))
      keys.append((name, i, "a"))
      requests.append(PairwiseRequest(record.id, theirs, mine[i], reference))
      keys.append((name, i, "b"))
  verdicts = judge.compare_captions(requests)
  n = len(records)
  score = {b: np.zeros(n) for b in baselines}
  wins = {b: np.zeros(n) for b in baselines}
  battles = {b: np.zeros(n) for b in baselines}
  result = SuiteResult()
  for (name, i, position), verdict in zip(keys, verdicts):
    if verdict.failed:
      result.count_failure("compare_captions")
      continue
    outcome = battle_outcome(verdict.winner, position)
    score[name][i] += 100.0 * outcome
    wins[name][i] += 100.0 * (outcome == 1)
    battles[name][i] += 1
  for name in baselines:
    result.metrics[f"caparena/{name}/score"] = RatioMetric.from_arrays(score[name], battles[name])
    result.metrics[f"caparena/{name}/win_rate"] = RatioMetric.from_arrays(wins[name], battles[name])
  for stat in ("score", "win_rate"):
    result.composites[f"caparena/{stat}"] = _baseline_average(tuple(f"caparena/{b}/{stat}" for b in baselines))
  return result


def _baseline_average(names: tuple[str, ...]):
  def average(values):
    return np.nanmean(np.stack([np.asarray(values[k], float) for k in names]), axis=0)

  return average
