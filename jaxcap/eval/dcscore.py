"""DCScore-style evaluation: atomic-unit precision and recall against reference captions.

precision = |caption units judged correct (and, by default, pointable)| / |caption units|
recall    = |reference units the caption states| / |reference units|
f1        = 2 P R / (P + R) per image (0 when both are 0)
all per image, averaged over images, in percent. Reference units come from the record, else from the judge's
split of the reference caption. Units with no visual content (meta-commentary) are not information units,
so they count against precision. A caption with no units gets `empty_caption_precision` (0: saying nothing
is not precise). Failed judgments mask the affected axis of that image (and its F1) and are counted.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from jaxcap.eval.captioners import CaptionSet
from jaxcap.eval.metrics import RatioMetric, SuiteResult
from jaxcap.judges.protocol import CaptionRequest, ClaimVerificationRequest, CoverageRequest, Judge
from jaxcap.data.records import ImageRecord


@dataclasses.dataclass(frozen=True)
class DCScoreConfig:
  require_pointable: bool = True
  empty_caption_precision: float = 0.0


def reference_units(judge: Judge, records: Sequence[ImageRecord], result: SuiteResult) -> list[tuple[str, ...] | None]:
  """Units per record: stored ones, else the judge's split of the reference caption; None if unavailable."""
  todo = [i for i, r in enumerate(records) if not r.reference_units and r.reference_caption]
  requests = [CaptionRequest(records[i].id, records[i].reference_caption) for i in todo]
  splits = judge.split_claims(requests) if requests else []
  units: list[tuple[str, ...] | None] = [tuple(r.reference_units) or None for r in records]
  for i, split in zip(todo, splits):
    if split.failed:
      result.count_failure("split_claims")
    else:
      units[i] = tuple(split.claims) or None
  result.count_failure("missing_reference", sum(not r.reference_units and not r.reference_caption for r in records))
  return units


def run_dcscore(
  judge: Judge, records: Sequence[ImageRecord], captions: CaptionSet, config: DCScoreConfig = DCScoreConfig()
) -> SuiteResult:
  """dcscore/precision, dcscore/recall, dcscore/f1 over `records` [N] for the first caption per image."""
  texts = captions.first(records)
  n = len(records)
  result = SuiteResult()
  precision, recall = np.zeros(n), np.zeros(n)
  p_ok, r_ok = np.zeros(n, bool), np.zeros(n, bool)

  splits = judge.split_claims([CaptionRequest(r.id, c) for r, c in zip(records, texts)])
  to_verify = []
  for i, split in enumerate(splits):
    if split.failed:
      result.count_failure("split_claims")
    elif not split.claims:
      precision[i], p_ok[i] = config.empty_caption_precision, True
    else:
      to_verify.append(i)
  verdicts = (
    judge.verify_claims([ClaimVerificationRequest(records[i].id, splits[i].claims) for i in to_verify])
    if to_verify
    else []
  )
  for i, v in zip(to_verify, verdicts):
    if v.failed:
      result.count_failure("verify_claims")
      continue
    pointable = v.pointable if config.require_pointable else (True,) * len(v.correct)
    good = sum(bool(c) and bool(p) for c, p in zip(v.correct, pointable))
    precision[i], p_ok[i] = good / len(splits[i].claims), True

  units = reference_units(judge, records, result)
  has_units = [i for i in range(n) if units[i]]
  coverage = (
    judge.match_reference_units([CoverageRequest(records[i].id, texts[i], units[i]) for i in has_units])
    if has_units
    else []
  )
  for i, cov in zip(has_units, coverage):
    if cov.failed:
      result.count_failure("match_reference_units")
      continue
    recall[i], r_ok[i] = sum(map(bool, cov.covered)) / len(units[i]), True

  both = p_ok & r_ok
  total = precision + recall
  f1 = np.divide(2 * precision * recall, total, out=np.zeros(n), where=total > 0)
  result.metrics["dcscore/precision"] = RatioMetric.per_image(100 * precision, p_ok)
  result.metrics["dcscore/recall"] = RatioMetric.per_image(100 * recall, r_ok)
  result.metrics["dcscore/f1"] = RatioMetric.per_image(100 * f1, both)
  return result
