"""RubiCap: reward = weighted pass rate of the image's rubric, sum_i w_i * pass_i / sum_i w_i."""

from __future__ import annotations

import collections
import dataclasses
from typing import Sequence

import numpy as np

from jaxcap.judges.protocol import CriterionRequest, Judge
from jaxcap.rewards.batch import RewardBatch, make_batch
from jaxcap.rewards.record import ImageRecord, align_records
from jaxcap.rewards.rubric import RubricStore


@dataclasses.dataclass(frozen=True)
class RubiCapConfig:
  # Share of the rubric's weight that must be judged (not failed) for a valid reward; the pass rate is
  # then taken over the judged criteria. 1.0 = any failed criterion masks the caption's reward.
  min_judged_weight_fraction: float = 1.0
  name: str = "rubicap/pass_rate"


class RubiCapReward:
  """Callable reward [N, 1]. Rubrics come from the records, else from `store` by image id."""

  def __init__(self, judge: Judge, config: RubiCapConfig = RubiCapConfig(), store: RubricStore | None = None):
    self.judge = judge
    self.config = config
    self.store = store
    self.names = (config.name,)

  def _rubric(self, record: ImageRecord):
    if record.rubric is not None:
      return record.rubric
    return self.store.load(record.id) if self.store is not None else None

  def __call__(self, captions: Sequence[str], records: Sequence[ImageRecord], *, step: int = 0) -> RewardBatch:
    records = align_records(captions, records)
    requests, owners, weights = [], [], []
    total_weight = np.zeros(len(captions))
    failed = collections.Counter()
    for i, (caption, record) in enumerate(zip(captions, records)):
      rubric = self._rubric(record)
      if rubric is None or not rubric.criteria:
        failed["missing_rubric"] += 1
        continue
      for criterion in rubric.criteria:
        requests.append(CriterionRequest(record.id, caption, criterion.text))
        owners.append(i)
        weights.append(criterion.weight)
        total_weight[i] += criterion.weight
    verdicts = self.judge.check_criteria(requests) if requests else []
    passed = np.zeros(len(captions))
    judged = np.zeros(len(captions))
    for owner, weight, verdict in zip(owners, weights, verdicts):
      if verdict.failed:
        failed["check_criteria"] += 1
        continue
      judged[owner] += weight
      passed[owner] += weight * verdict.passed
    valid = (judged > 0) & (judged >= self.config.min_judged_weight_fraction * total_weight - 1e-9)
    rate = np.divide(passed, judged, out=np.zeros_like(passed), where=judged > 0)
    return make_batch(self.names, rate[:, None], valid[:, None], [1.0], captions, records, failed)
