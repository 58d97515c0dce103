import json

import numpy as np
import pytest

from jaxcap.judges.protocol import CriterionVerdict
from jaxcap.world.rubric_criteria import DENIES_PREFIX, NO_META_CRITERION, STATES_PREFIX
from jaxcap.data.records import Criterion, ImageRecord, Rubric
from jaxcap.rewards.rubicap import RubiCapConfig, RubiCapReward
from jaxcap.rewards.rubric import RubricJob, RubricStore, synthesize_rubrics
import rewards_world as W

RUBRIC = Rubric(
  "img", (Criterion("c-critical", "critical"), Criterion("c-important", "important"), Criterion("c-minor", "minor"))
)


class Scripted:
  def __init__(self, passes, fails=()):
    self.passes, self.fails = passes, fails

  def check_criteria(self, requests):
    return [
      CriterionVerdict(failed=True)
      if r.criterion in self.fails
      else CriterionVerdict(passed=r.criterion in self.passes)
      for r in requests
    ]


def test_weights_are_3_2_1():
  assert [c.weight for c in RUBRIC.criteria] == [3.0, 2.0, 1.0]
  with pytest.raises(ValueError, match="severity"):
    Criterion("x", "fatal")


def test_weighted_pass_rate_hand_computed():
  rec = ImageRecord("img", rubric=RUBRIC)
  batch = RubiCapReward(Scripted({"c-critical", "c-minor"}))(["a", "b"], [rec])
  np.testing.assert_allclose(batch.values[:, 0], (3 + 1) / 6)
  batch = RubiCapReward(Scripted({"c-important"}))(["a"], [rec])
  np.testing.assert_allclose(batch.values[:, 0], 2 / 6)


def test_failed_criterion_masks_by_default_and_renormalises_when_allowed():
  rec = ImageRecord("img", rubric=RUBRIC)
  judge = Scripted({"c-critical"}, fails={"c-minor"})
  strict = RubiCapReward(judge)(["a"], [rec])
  assert not strict.valid.any() and strict.failed_judgments == {"check_criteria": 1}
  lenient = RubiCapReward(judge, RubiCapConfig(min_judged_weight_fraction=0.5))(["a"], [rec])
  assert lenient.valid.all() and lenient.values[0, 0] == pytest.approx(3 / 5)
  missing = RubiCapReward(judge)(["a"], [ImageRecord("no-rubric")])
  assert not missing.valid.any() and missing.failed_judgments == {"missing_rubric": 1}


HAND_TEACHERS = (
  'A large red circle is in the top left, labelled "EXIT". A small blue square is in the top right.',
  "There is a large red circle in the top left. A green triangle is at the bottom.",
  "A red circle is in the top left. A small blue square is in the top right. A purple star is in the center.",
  "A large red circle. A small blue square. A green triangle.",
  "A purple star sits in the center. A red circle is at the bottom.",
)


def test_synthesis_consensus_failures_and_severities():
  student = "There is a red circle at the bottom. A yellow diamond is on the left. The mood is joyful."
  (outcome,) = synthesize_rubrics(W.judge(), [RubricJob("hand", HAND_TEACHERS, student)])
  rubric = outcome.rubric
  # Stated by >= 3 of 5: red circle (5), large (3), top left (3), blue square (3), small (3). The purple star
  # (2 teachers), the label (1) and the green triangle (2) are not consensus.
  assert set(rubric.consensus) == {
    "There is a red circle.",
    "The red circle is large.",
    "The red circle is in the top left.",
    "There is a blue square.",
    "The blue square is small.",
  }
  criteria = {c.text: c.weight for c in rubric.criteria}
  assert criteria == {
    STATES_PREFIX + "The red circle is large.": 2.0,
    STATES_PREFIX + "The red circle is in the top left.": 2.0,
    STATES_PREFIX + "There is a blue square.": 2.0,
    STATES_PREFIX + "The blue square is small.": 2.0,
    DENIES_PREFIX + "The red circle is at the bottom.": 3.0,
    DENIES_PREFIX + "There is a yellow diamond.": 3.0,
    DENIES_PREFIX + "The yellow diamond is on the left.": 3.0,
    NO_META_CRITERION: 1.0,
  }


def test_student_without_failures_gets_consensus_criteria():
  (outcome,) = synthesize_rubrics(W.judge(), [RubricJob("hand", HAND_TEACHERS, W.REFERENCE)])
  assert {c.text for c in outcome.rubric.criteria} == {STATES_PREFIX + u for u in outcome.rubric.consensus}


def test_synthesis_failure_yields_no_rubric_and_error():
  (outcome,) = synthesize_rubrics(W.judge(failure_rate=1.0), [RubricJob("hand", HAND_TEACHERS, "x")])
  assert outcome.rubric is None and "failed" in outcome.error


def test_ranking_complete_weak_teacher_empty_and_hallucination():
  (outcome,) = synthesize_rubrics(
    W.judge(), [RubricJob("hand", tuple(W.TEACHERS.values()), "There is a red circle at the top. So pretty.")]
  )
  rec = W.record(rubric=outcome.rubric)
  captions = [
    W.REFERENCE,
    W.TEACHERS["terse"],
    W.CAPTIONS["partial"],
    W.CAPTIONS["empty"],
    "There is a red circle at the top. " + W.REFERENCE,
  ]
  complete, terse, partial, empty, with_error = RubiCapReward(W.judge())(captions, [rec]).values[:, 0]
  assert complete == 1.0
  assert complete > terse > empty and complete > partial > empty
  assert with_error < complete


def test_store_roundtrip_jsonl_and_resynthesis(tmp_path):
  store = RubricStore(tmp_path / "rubrics")
  jobs = [RubricJob("hand", HAND_TEACHERS, "There is a red circle.")]
  first = store.synthesize(W.judge(), jobs)
  assert "hand" in store and store.load("hand") == first[0].rubric
  assert json.loads(store.path("hand").read_text())["image_id"] == "hand"
  assert store.synthesize(W.judge(), jobs) == []  # already stored: skipped
  redo = store.synthesize(W.judge(), [RubricJob("hand", HAND_TEACHERS, W.REFERENCE)], overwrite=True)
  assert store.load("hand") == redo[0].rubric != first[0].rubric
  assert store.export_jsonl(tmp_path / "all.jsonl") == 1
  other = RubricStore(tmp_path / "copy")
  assert other.import_jsonl(tmp_path / "all.jsonl") == 1 and other.load("hand") == redo[0].rubric
  # The reward falls back to the store when a record carries no rubric.
  batch = RubiCapReward(W.judge(), store=store)([W.REFERENCE], [ImageRecord("hand")])
  assert batch.valid.all() and batch.values[0, 0] == 1.0
