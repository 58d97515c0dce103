"""Exact formulas on hand-computed cases: CapArena (position swap, ties, failures), CaptionQA scoring,
Prism best-of-n vs mean, b-CapScore, and the ratio bootstrap."""

import math

import numpy as np
import pytest
from eval_world import ScriptedAnswerJudge, ScriptedPairwiseJudge

from jaxcap.eval.bcapscore import b_capscore, bcapscore_composite
from jaxcap.eval.caparena import battle_outcome, run_caparena
from jaxcap.eval.captionqa import CANNOT_ANSWER, CaptionQAConfig, question_score, run_captionqa
from jaxcap.eval.captioners import CaptionSet
from jaxcap.eval.metrics import RatioMetric, bootstrap_differences, bootstrap_estimates
from jaxcap.eval.prism import run_prism
from jaxcap.data.records import ImageRecord, MultipleChoiceQuestion

RECORDS = [ImageRecord(id=f"img{i}") for i in range(3)]
CANDIDATE = CaptionSet("cand", {r.id: (f"cand {r.id}",) for r in RECORDS})
BASE = CaptionSet("base", {r.id: (f"base {r.id}",) for r in RECORDS})


def _arena_script(table):
  """table[image id] = (verdict with the candidate as "a", verdict with the candidate as "b")."""

  def script(request):
    first, second = table[request.image_id]
    return first if request.caption_a.startswith("cand") else second

  return script


def test_battle_outcome_is_from_the_candidates_side():
  assert battle_outcome("a", "a") == 1 and battle_outcome("b", "a") == -1
  assert battle_outcome("b", "b") == 1 and battle_outcome("a", "b") == -1
  assert battle_outcome("tie", "a") == 0 == battle_outcome("tie", "b")
  with pytest.raises(ValueError, match="'a', 'b' or 'tie'"):
    battle_outcome("A", "a")


def test_caparena_score_with_position_swap_ties_and_failures():
  # img0: candidate wins in both orders (+1, +1). img1: judge always picks slot "a" (position bias): +1, -1.
  # img2: tie in the first order, the second order failed -> one battle (0), the failure is masked.
  judge = ScriptedPairwiseJudge(_arena_script({"img0": ("a", "b"), "img1": ("a", "a"), "img2": ("tie", None)}))
  result = run_caparena(judge, RECORDS, CANDIDATE, {"base": BASE})
  # Every image judged in both orders: candidate in slot a, then in slot b.
  slots = [(r.caption_a.split()[0], r.caption_b.split()[0]) for r in judge.calls[:2]]
  assert slots == [("cand", "base"), ("base", "cand")]
  score, wins = result.metrics["caparena/base/score"], result.metrics["caparena/base/win_rate"]
  # 5 valid battles: W = 3, L = 1, T = 1 -> score 100 * (3 - 1) / 5 = 40, win rate 100 * 3 / 5 = 60.
  assert score.value == pytest.approx(40.0) and wins.value == pytest.approx(60.0)
  assert score.den == (2.0, 2.0, 1.0)
  assert result.failures == {"compare_captions": 1}


def test_caparena_averages_baselines_and_sweeps_to_the_bounds():
  judge = ScriptedPairwiseJudge(lambda r: "a" if r.caption_a.startswith("cand") else "b")  # candidate always wins
  other = CaptionSet("other", {r.id: ("other",) for r in RECORDS})
  result = run_caparena(judge, RECORDS, CANDIDATE, {"base": BASE, "other": other})
  est = bootstrap_estimates(result.metrics, result.composites, num_resamples=0)
  assert est["caparena/score"].mean == 100.0 and est["caparena/win_rate"].mean == 100.0
  lose = ScriptedPairwiseJudge(lambda r: "b" if r.caption_a.startswith("cand") else "a")
  result = run_caparena(lose, RECORDS, CANDIDATE, {"base": BASE, "other": other})
  assert bootstrap_estimates(result.metrics, result.composites, num_resamples=0)["caparena/score"].mean == -100.0


def test_caparena_all_ties_score_zero_and_reference_is_passed():
  records = [ImageRecord(id="img0", reference_caption="the human caption")]
  judge = ScriptedPairwiseJudge(lambda r: "tie")
  result = run_caparena(judge, records, CANDIDATE, {"base": BASE})
  assert result.metrics["caparena/base/score"].value == 0.0
  assert result.metrics["caparena/base/win_rate"].value == 0.0
  assert all(r.reference == "the human caption" for r in judge.calls)


def test_captionqa_question_score():
  assert question_score(2, 2, 4, 4) == 1.0
  assert question_score(4, 2, 4, 4) == pytest.approx(1 / 4 + 0.05)  # cannot answer with n = 4 options
  assert question_score(4, 2, 4, 3) == pytest.approx(1 / 3 + 0.05)
  assert question_score(0, 2, 4, 4) == 0.0  # wrong
  assert question_score(None, 2, 4, 4) == 0.0  # unparseable
  assert question_score(1, 0, None, 2) == 0.0  # yes/no has no cannot-answer option


def _qa_record():
  q4 = MultipleChoiceQuestion("q4", "What colour is it?", ("red", "blue", "green", "grey"), "red", "colour")
  yn = MultipleChoiceQuestion("yn", "Is there a star?", ("yes", "no"), "no", "existence")
  return ImageRecord(id="img0", questions=(q4, yn))


def test_captionqa_scoring_end_to_end():
  # Full caption: colour answered "cannot answer", yes/no answered correctly (by option text).
  # 3-word cut: colour answered wrong, yes/no failed (masked).
  def script(request):
    truncated = len(request.caption.split()) <= 3
    if request.question.startswith("What colour"):
      assert request.options[-1] == CANNOT_ANSWER and len(request.options) == 5
      wrong = next(o for o in request.options if o not in ("red", CANNOT_ANSWER))
      return "ABCDE"[request.options.index(wrong)] if truncated else "E"
    assert CANNOT_ANSWER not in request.options  # yes/no questions get no cannot-answer option
    return None if truncated else "The answer is no"

  judge = ScriptedAnswerJudge(script)
  captions = CaptionSet("m", {"img0": ("one two three four five",)})
  result = run_captionqa(judge, [_qa_record()], captions, CaptionQAConfig(word_limits=(3,)))
  assert result.metrics["captionqa/full"].value == pytest.approx(100 * ((1 / 4 + 0.05) + 1.0) / 2)
  assert result.metrics["captionqa/w3"].value == 0.0 and result.metrics["captionqa/w3"].den == (1.0,)
  assert result.failures == {"answer_multiple_choice": 1}
  # Option order is seeded by image and question only: the same for every captioner.
  other = ScriptedAnswerJudge(script)
  run_captionqa(
    other, [_qa_record()], CaptionSet("n", {"img0": ("five four three two one",)}), CaptionQAConfig(word_limits=(3,))
  )
  assert [r.options for r in other.calls] == [r.options for r in judge.calls]


def test_prism_best_of_n_and_mean_over_n():
  record = _qa_record()
  captions = CaptionSet("m", {"img0": ("good", "bad", "failing")})

  def script(request):  # "good" answers correctly, "bad" wrongly, "failing" fails
    if request.caption == "failing":
      return None
    gold = "red" if request.question.startswith("What colour") else "no"
    pick = gold if request.caption == "good" else next(o for o in request.options if o != gold)
    return "ABCD"[request.options.index(pick)]

  result = run_prism(ScriptedAnswerJudge(script), [record], captions)
  est = bootstrap_estimates(result.metrics, result.composites, num_resamples=0)
  assert est["prism/colour/mean@n"].mean == 50.0 and est["prism/colour/best@n"].mean == 100.0
  assert est["prism/mean@n"].mean == 50.0 and est["prism/best@n"].mean == 100.0
  assert result.failures == {"answer_multiple_choice": 2}  # masked, so mean@n is 1/2, not 1/3


def test_b_capscore_is_the_harmonic_mean_of_the_three_axes():
  # CapArena 0 -> 50 on the percent scale; HM(40, 80, 50) = 3 / (1/40 + 1/80 + 1/50) = 52.1739...
  assert float(b_capscore(40.0, 80.0, 0.0)) == pytest.approx(3 / (1 / 40 + 1 / 80 + 1 / 50))
  assert float(b_capscore(60.0, 60.0, 20.0)) == pytest.approx(60.0)
  assert float(b_capscore(0.0, 90.0, 50.0)) == 0.0  # a collapsed axis zeroes the score
  assert float(b_capscore(90.0, 90.0, -100.0)) == 0.0
  assert math.isnan(float(b_capscore(np.nan, 90.0, 0.0)))
  composite = bcapscore_composite()
  with pytest.raises(KeyError, match="dcscore/f1"):
    composite({"captionqa/full": np.ones(1), "caparena/score": np.ones(1)})


def test_bootstrap_ratio_estimates_mask_and_interval():
  metric = RatioMetric.from_arrays([3.0, 1.0, 0.0, 5.0], [4.0, 1.0, 0.0, 5.0])  # image 2 masked
  est = bootstrap_estimates({"m": metric}, num_resamples=500, seed=1)["m"]
  assert est.mean == pytest.approx(9 / 10) and est.count == 3
  assert est.low <= est.mean <= est.high and est.low >= 0.75 - 1e-9 and est.high <= 1.0
  assert metric.masked == 1 and np.isnan(metric.image_values[2])
  point = bootstrap_estimates({"m": metric}, num_resamples=0)["m"]
  assert point.low is None and point.format() == "0.9"
  empty = bootstrap_estimates({"m": RatioMetric.from_arrays([0.0], [0.0])}, num_resamples=10)["m"]
  assert empty.mean is None and empty.format() == "n/a"
  with pytest.raises(ValueError, match="different numbers of images"):
    bootstrap_estimates({"a": metric, "b": RatioMetric.from_arrays([1.0], [1.0])})


def test_paired_bootstrap_difference():
  a = RatioMetric.from_arrays([1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0])
  b = RatioMetric.from_arrays([0.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0])
  same = bootstrap_differences({"m": a}, {"m": a}, num_resamples=200)["m"]
  assert (same.mean, same.low, same.high) == (0.0, 0.0, 0.0)  # paired resamples: no spurious spread
  diff = bootstrap_differences({"m": a}, {"m": b}, num_resamples=500)["m"]
  assert diff.mean == pytest.approx(0.5) and diff.low >= 0.0 and diff.count == 4
