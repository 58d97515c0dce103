"""On the synthetic world the suites rank reference > weak teachers > empty on every axis, and failed
judgments are masked and counted rather than scored as 0."""

import numpy as np
import pytest
from eval_world import WEAK_TEACHERS, builtin, world

from jaxcap.eval.evaluate import EvalConfig, evaluate, headline_metrics
from jaxcap.world.judge import RuleBasedJudge

CONFIG = EvalConfig(redteam=None, bootstrap_resamples=100)
AXES = [k for k in headline_metrics(CONFIG) if k != "length/words"]


@pytest.fixture(scope="module")
def report():
  _, records, judge = world()
  captioners = [
    builtin("reference", records),
    *(builtin(f"teacher:{t}", records, t) for t in WEAK_TEACHERS),
    builtin("empty", records),
  ]
  baselines = {"student": builtin("student", records), "meticulous": builtin("teacher:meticulous", records)}
  return evaluate(judge, records, captioners, baselines=baselines, config=CONFIG)


def _mean(report, model, metric):
  return report.model(model).estimates[metric].mean


@pytest.mark.parametrize("teacher", WEAK_TEACHERS)
def test_reference_above_weak_teacher_above_empty_on_every_axis(report, teacher):
  for metric in AXES:
    ref, mid, empty = (_mean(report, m, metric) for m in ("reference", teacher, "empty"))
    if metric == "dcscore/precision" and teacher == "terse":
      # A terse list of true facts is exactly as precise as the reference; it loses on recall.
      assert ref == mid > empty, metric
      continue
    assert ref > mid > empty, f"{metric}: reference {ref}, {teacher} {mid}, empty {empty}"


def test_empty_captions_score_the_floor(report):
  est = report.model("empty").estimates
  assert est["caparena/score"].mean == -100.0 and est["dcscore/f1"].mean == 0.0 and est["bcapscore"].mean == 0.0
  # Without a caption the judge can only answer "cannot answer": 1/n + 0.05 per non-yes/no question.
  assert 0.0 < est["captionqa/full"].mean < 100 * (1 / 4 + 0.05) + 1e-6


def test_intervals_bracket_the_estimates(report):
  for model in report.models:
    for metric in AXES:
      e = model.estimates[metric]
      assert e.low - 1e-9 <= e.mean <= e.high + 1e-9, (model.name, metric, e)


def test_failed_judgments_are_masked_and_counted_not_zero():
  manifest, records, judge = world()
  flaky = RuleBasedJudge(judge.scenes, failure_rate=0.3, seed=7)
  reference = builtin("reference", records)
  report = evaluate(flaky, records, [reference], baselines={"student": builtin("student", records)}, config=CONFIG)
  model = report.model("reference")
  for primitive in ("answer_multiple_choice", "split_claims", "match_reference_units", "compare_captions"):
    assert model.failures.get(primitive, 0) > 0, primitive
  # A perfect caption stays perfect on what was judged: failures drop out instead of counting as wrong.
  for metric in ("prism/mean@n", "captionqa/full", "dcscore/precision", "dcscore/recall", "caparena/score"):
    assert model.estimates[metric].mean == pytest.approx(100.0), metric
  # Some images lost every judgment of an axis, so fewer images count, and the report says so.
  assert min(model.estimates[k].count for k in ("dcscore/precision", "dcscore/recall")) < len(records)
  assert np.isnan(model.image_values("dcscore/f1")).any()
