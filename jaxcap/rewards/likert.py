"""The papers' judge baselines: Direct-Likert (score 1-10 from the image) and Reference-Likert (against the
reference caption). Reward = (score - 1) / 9 in [0, 1]."""

from __future__ import annotations

import collections
from typing import Sequence

import numpy as np

from jaxcap.judges.protocol import Judge, LikertRequest
from jaxcap.rewards.batch import RewardBatch, make_batch
from jaxcap.data.records import ImageRecord, align_records
from jaxcap.rewards.families import reward_family


class LikertReward:
  """`reference=False`: Direct-Likert; `reference=True`: Reference-Likert (masked when no reference)."""

  def __init__(self, judge: Judge, *, reference: bool = False, name: str | None = None):
    self.judge = judge
    self.reference = reference
    self.names = (name or ("likert/reference" if reference else "likert/direct"),)

  def __call__(
    self, captions: Sequence[str], records: Sequence[ImageRecord], *, step: int = 0, first: int = 0
  ) -> RewardBatch:
    records = align_records(captions, records)
    failed = collections.Counter()
    asked = [i for i, r in enumerate(records) if not self.reference or r.reference_caption]
    failed["missing_reference"] += len(records) - len(asked)
    scores = (
      self.judge.score_likert(
        [
          LikertRequest(records[i].id, captions[i], records[i].reference_caption if self.reference else None)
          for i in asked
        ]
      )
      if asked
      else []
    )
    values = np.zeros(len(captions))
    valid = np.zeros(len(captions), bool)
    evidence = [{self.names[0]: {"score": None}} for _ in captions]  # the judge's 1-10 score
    for i, s in zip(asked, scores):
      if s.failed:
        failed["score_likert"] += 1
        continue
      values[i], valid[i] = (min(10.0, max(1.0, float(s.score))) - 1) / 9, True
      evidence[i][self.names[0]]["score"] = float(s.score)
    return make_batch(self.names, values[:, None], valid[:, None], [1.0], captions, records, failed, evidence)


@reward_family("likert_direct", options=("name",))
def likert_direct_reward(judge: Judge, *, name: str | None = None) -> LikertReward:
  return LikertReward(judge, reference=False, name=name)


@reward_family("likert_reference", options=("name",))
def likert_reference_reward(judge: Judge, *, name: str | None = None) -> LikertReward:
  return LikertReward(judge, reference=True, name=name)
