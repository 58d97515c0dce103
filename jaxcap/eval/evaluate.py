"""Runs the suites for several captioners on the same images and judge, and assembles one `EvalReport`."""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np

from jaxcap.eval.bcapscore import bcapscore_composite
from jaxcap.eval.captionqa import CaptionQAConfig, metric_name, run_captionqa
from jaxcap.eval.caparena import CapArenaConfig, run_caparena
from jaxcap.eval.captioners import CaptionSet
from jaxcap.eval.dcscore import DCScoreConfig, run_dcscore
from jaxcap.eval.metrics import (
  RatioMetric,
  SuiteResult,
  bootstrap_differences,
  bootstrap_estimates,
  evaluate_composites,
)
from jaxcap.eval.prism import PrismConfig, run_prism
from jaxcap.eval.redteam import RedTeamConfig, run_redteam
from jaxcap.eval.report import EvalReport, ModelEvaluation
from jaxcap.judges.protocol import Judge
from jaxcap.data.records import ImageRecord

SUITES = ("prism", "captionqa", "dcscore", "caparena")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  suites: tuple[str, ...] = SUITES
  prism: PrismConfig = PrismConfig()
  captionqa: CaptionQAConfig = CaptionQAConfig()
  dcscore: DCScoreConfig = DCScoreConfig()
  caparena: CapArenaConfig = CapArenaConfig()
  bcapscore_captionqa_metric: str = "captionqa/full"  # which CaptionQA word limit b-CapScore uses
  redteam: RedTeamConfig | None = RedTeamConfig()  # None: skip the red team
  compare_to: str = ""  # captioner the others are differenced against (paired); "" = the first, "none" = skip
  bootstrap_resamples: int = 1000
  confidence: float = 0.95
  seed: int = 0

  def __post_init__(self):
    unknown = set(self.suites) - set(SUITES)
    if unknown:
      raise ValueError(f"Unknown eval suites {sorted(unknown)}; choose from {SUITES}.")


def headline_metrics(config: EvalConfig) -> tuple[str, ...]:
  """Main-table columns for the enabled suites."""
  out = []
  if "prism" in config.suites:
    out += ["prism/mean@n", "prism/best@n"]
  if "captionqa" in config.suites:
    out += [metric_name(limit) for limit in config.captionqa.limits]
  if "dcscore" in config.suites:
    out += ["dcscore/precision", "dcscore/recall", "dcscore/f1"]
  if "caparena" in config.suites:
    out += ["caparena/score", "caparena/win_rate"]
  if {"captionqa", "dcscore", "caparena"} <= set(config.suites):
    out.append("bcapscore")
  return tuple(out + ["length/words"])


def evaluate_captioner(
  judge: Judge,
  records: Sequence[ImageRecord],
  captions: CaptionSet,
  baselines: Mapping[str, CaptionSet],
  config: EvalConfig,
) -> SuiteResult:
  """All enabled suites for one captioner, merged; adds length/words and b-CapScore."""
  captions.check_covers(records)
  result = SuiteResult()
  if "prism" in config.suites:
    result = result.merge(run_prism(judge, records, captions, config.prism))
  if "captionqa" in config.suites:
    result = result.merge(run_captionqa(judge, records, captions, config.captionqa))
  if "dcscore" in config.suites:
    result = result.merge(run_dcscore(judge, records, captions, config.dcscore))
  if "caparena" in config.suites:
    result = result.merge(run_caparena(judge, records, captions, baselines, config.caparena))
  if {"captionqa", "dcscore", "caparena"} <= set(config.suites):
    result.composites["bcapscore"] = bcapscore_composite(captionqa_metric=config.bcapscore_captionqa_metric)
  lengths = [len(c.split()) for c in captions.first(records)]
  result.metrics["length/words"] = RatioMetric.per_image(lengths, np.ones(len(records), bool))
  return result


def evaluate(
  judge: Judge,
  records: Sequence[ImageRecord],
  captioners: Sequence[CaptionSet],
  *,
  baselines: Mapping[str, CaptionSet] = {},
  honest: CaptionSet | None = None,
  config: EvalConfig = EvalConfig(),
  judge_name: str = "",
  settings: Mapping | None = None,
) -> EvalReport:
  """Evaluates every captioner on `records` with `judge`; the red team runs when `honest` is given."""
  if not records:
    raise ValueError("No images to evaluate; the manifest is empty.")
  names = [c.name for c in captioners]
  if len(set(names)) != len(names):
    raise ValueError(f"Captioner names {names} repeat; give each captioner a distinct name.")
  for baseline in baselines.values():
    baseline.check_covers(records)
  compare_to = names[0] if config.compare_to == "" else config.compare_to
  if compare_to != "none" and compare_to not in names:
    raise ValueError(f"compare_to={compare_to!r} is not a captioner ({names}); name one, or 'none' to skip.")
  models, results = [], {}
  for captions in captioners:
    result = results[captions.name] = evaluate_captioner(judge, records, captions, baselines, config)
    estimates = bootstrap_estimates(
      result.metrics,
      result.composites,
      num_resamples=config.bootstrap_resamples,
      confidence=config.confidence,
      seed=config.seed,
    )
    per_image = evaluate_composites({k: m.image_values for k, m in result.metrics.items()}, result.composites)
    models.append(
      ModelEvaluation(
        name=captions.name,
        samples_per_image=float(np.mean([len(captions.samples(r.id)) for r in records])),
        lengths=tuple(int(x) for x in result.metrics["length/words"].num),
        metrics=result.metrics,
        composite_values={
          k: tuple(None if not np.isfinite(v) else float(v) for v in per_image[k]) for k in result.composites
        },
        estimates=estimates,
        failures=result.failures,
      )
    )
  differences = {}
  if compare_to != "none":
    base = results[compare_to]
    differences = {
      name: bootstrap_differences(
        result.metrics,
        base.metrics,
        result.composites,
        num_resamples=config.bootstrap_resamples,
        confidence=config.confidence,
        seed=config.seed,
      )
      for name, result in results.items()
      if name != compare_to
    }
  redteam, redteam_failures = ((), {})
  if honest is not None and config.redteam is not None:
    rows, redteam_failures = run_redteam(judge, records, honest, config.redteam)
    redteam = tuple(rows)
  run_settings = {
    "bootstrap_resamples": config.bootstrap_resamples,
    "confidence": config.confidence,
    "seed": config.seed,
    "suites": list(config.suites),
    "baselines": sorted(baselines),
    "honest": honest.name if honest else None,
  } | dict(settings or {})
  return EvalReport(
    image_ids=tuple(r.id for r in records),
    judge=judge_name or type(judge).__name__,
    models=tuple(models),
    headline=headline_metrics(config),
    compared_to=compare_to if differences else "",
    differences=differences,
    redteam=redteam,
    redteam_failures=redteam_failures,
    settings=run_settings,
  )
