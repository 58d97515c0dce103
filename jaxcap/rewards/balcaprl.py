"""BalCapRL: precision, recall and linguistic quality as one named reward vector [N, 3] for c-GDPO.

precision  = |claims both correct and pointable| / |claims|
recall     = |reference units the caption covers| / |reference units|
linguistic = mean over (clarity, fluency, coherence) of (rating - 1) / 9, ratings on 1-10
The two-sided length-conditional mask on the linguistic reward is the RL core's job; this module exposes
the caption and reference lengths it needs (RewardBatch.caption_lengths / reference_lengths).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Sequence

import numpy as np

from jaxcap.judges.protocol import CaptionRequest, ClaimVerificationRequest, CoverageRequest, Judge
from jaxcap.rewards.batch import RewardBatch, make_batch
from jaxcap.data.records import ImageRecord, align_records
from jaxcap.rewards.families import reward_family

NAMES = ("balcaprl/precision", "balcaprl/recall", "balcaprl/linguistic")


@dataclasses.dataclass(frozen=True)
class BalCapRLConfig:
  weights: tuple[float, float, float] = (0.1, 0.3, 0.3)  # w_prec, w_rec, w_ling (paper)
  # Precision of a caption with no claims: 0 so that saying nothing is never "perfectly precise".
  empty_caption_precision: float = 0.0


class BalCapRLReward:
  """Callable reward [N, 3]; each dimension is masked independently when its judge calls fail."""

  def __init__(self, judge: Judge, config: BalCapRLConfig = BalCapRLConfig()):
    self.judge = judge
    self.config = config
    self.names = NAMES
    self._units_cache: dict[str, tuple[str, ...]] = {}

  def reference_units(
    self, records: Sequence[ImageRecord], failed: collections.Counter
  ) -> list[tuple[str, ...] | None]:
    """Units O per record: stored ones, else the judge's split of the reference caption (cached per image)."""
    todo = {r.id: r for r in records if not r.reference_units and r.reference_caption and r.id not in self._units_cache}
    if todo:
      splits = self.judge.split_claims([CaptionRequest(i, r.reference_caption) for i, r in todo.items()])
      for image_id, split in zip(todo, splits):
        if split.failed:
          failed["split_claims"] += 1
        else:
          self._units_cache[image_id] = split.claims
    return [r.reference_units or self._units_cache.get(r.id) for r in records]

  def __call__(
    self, captions: Sequence[str], records: Sequence[ImageRecord], *, step: int = 0, first: int = 0
  ) -> RewardBatch:
    records = align_records(captions, records)
    n = len(captions)
    values = np.zeros((n, 3))
    valid = np.zeros((n, 3), bool)
    failed = collections.Counter()
    evidence: list[dict] = [{} for _ in captions]  # claims with verdicts, covered units, language scores

    # precision: split, then verify.
    splits = self.judge.split_claims([CaptionRequest(r.id, c) for c, r in zip(captions, records)])
    to_verify = []
    for i, split in enumerate(splits):
      if split.failed:
        failed["split_claims"] += 1
      elif not split.claims:
        values[i, 0], valid[i, 0] = self.config.empty_caption_precision, True
      else:
        to_verify.append(i)
    verdicts = (
      self.judge.verify_claims([ClaimVerificationRequest(records[i].id, splits[i].claims) for i in to_verify])
      if to_verify
      else []
    )
    for i, v in zip(to_verify, verdicts):
      if v.failed:
        failed["verify_claims"] += 1
        continue
      good = sum(bool(c) and bool(p) for c, p in zip(v.correct, v.pointable))
      evidence[i]["claims"] = [
        {"claim": t, "correct": bool(c), "pointable": bool(p)}
        for t, c, p in zip(splits[i].claims, v.correct, v.pointable)
      ]
      values[i, 0], valid[i, 0] = good / len(splits[i].claims), True

    # recall: coverage of the reference units.
    units = self.reference_units(records, failed)
    has_units = [i for i in range(n) if units[i]]
    coverages = (
      self.judge.match_reference_units(
        [CoverageRequest(records[i].id, captions[i], tuple(units[i])) for i in has_units]
      )
      if has_units
      else []
    )
    for i, cov in zip(has_units, coverages):
      if cov.failed:
        failed["match_reference_units"] += 1
        continue
      values[i, 1], valid[i, 1] = sum(map(bool, cov.covered)) / len(units[i]), True
      evidence[i]["units"] = [{"unit": u, "covered": bool(c)} for u, c in zip(units[i], cov.covered)]

    # linguistic: mean of three 1-10 ratings mapped to [0, 1].
    ratings = self.judge.rate_language([CaptionRequest(r.id, c) for c, r in zip(captions, records)])
    for i, rt in enumerate(ratings):
      if rt.failed:
        failed["rate_language"] += 1
        continue
      mapped = [(min(10.0, max(1.0, float(x))) - 1) / 9 for x in (rt.clarity, rt.fluency, rt.coherence)]
      values[i, 2], valid[i, 2] = sum(mapped) / 3, True
      evidence[i]["language"] = {"clarity": rt.clarity, "fluency": rt.fluency, "coherence": rt.coherence}
    evidence = [{"balcaprl": e} for e in evidence]
    return make_batch(self.names, values, valid, self.config.weights, captions, records, failed, evidence)


@reward_family("balcaprl", options=BalCapRLConfig)
def balcaprl_reward(judge: Judge, **options) -> BalCapRLReward:
  if "weights" in options:
    options["weights"] = tuple(options["weights"])
  return BalCapRLReward(judge, BalCapRLConfig(**options))
