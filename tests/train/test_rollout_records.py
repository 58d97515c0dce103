"""Rollout records (jaxcap.train.logs.rollout_records): which groups a file holds, what each caption's row says (hand
computed rewards and GRPO advantages, stop reasons, the judge's evidence), bounded strict JSON, and resume."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from jaxcap.data.records import ImageRecord
from jaxcap.rewards.batch import RewardBatch
from jaxcap.rewards.caprl import CapRLReward
from jaxcap.train.logs.rollout_records import RolloutRecorder, pick_groups, recorded_steps

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rewards"))
import rewards_world as W  # noqa: E402

STOP = 7


def _strict(line):
  return json.loads(line, parse_constant=lambda c: pytest.fail(f"bare {c} in {line}"))


def _recorder(tmp_path, groups=3, max_chars=2000):
  return RolloutRecorder(tmp_path / "rollouts", 2, groups, max_chars, "Describe the image.", "grpo", (STOP,))


def _batch(values, valid, weights=(1.0, 0.5)):
  n = len(values)
  return RewardBatch(
    names=("a/x", "b/y"),
    values=np.asarray(values, np.float32),
    valid=np.asarray(valid, bool),
    weights=np.asarray(weights, np.float32),
    caption_lengths=np.arange(n, dtype=np.int32) + 3,
    reference_lengths=np.full(n, 10, np.int32),
    evidence=tuple({"a/x": {"i": i}} for i in range(n)),
  )


def test_pick_groups_keeps_best_and_worst_and_spans_the_ranking():
  means = np.array([0.5, 0.9, 0.1, np.nan, 0.7, 0.3, 0.2])
  picked = pick_groups(means, 4)
  assert picked[0] == (1, "best") and picked[-1] == (3, "worst")  # a group with no judged caption ranks last
  assert len(picked) == 4 and len({i for i, _ in picked}) == 4
  assert pick_groups(means[:2], 5) == [(1, "best"), (0, "worst")]
  assert [r for _, r in pick_groups(means, 2)] == ["best", "worst"]


def test_a_record_file_holds_the_sampled_groups_with_hand_computed_rows(tmp_path):
  # 4 groups of G = 2: weighted rewards 1*x + 0.5*y
  values = [[1, 0], [0, 0], [0.2, 0.2], [0.2, 0.2], [1, 1], [0.5, 1], [0, 0], [0, 0.4]]
  valid = np.ones((8, 2), bool)
  valid[7, 1] = False  # not judged: its reward is null, the group's mean is its other caption's
  records = [ImageRecord(id=f"r{b}", image=f"img/{b}.png", reference_caption=f"ref {b}") for b in range(4)]
  captions = [f"caption {j}" for j in range(8)]
  tokens = np.zeros((8, 5), np.int32)
  tokens[0, 2] = STOP  # sample 0 stopped; the others ran to max_new_tokens
  lengths = np.array([3, 5, 5, 5, 5, 5, 5, 5])
  rec = _recorder(tmp_path)
  groups = rec.groups_of(4, records, captions, _batch(values, valid), tokens, lengths)
  assert [(g["record_id"], g["rank"]) for g in groups] == [("r2", "best"), ("r0", "sample"), ("r3", "worst")]
  best = groups[0]
  assert best["group_reward"] == pytest.approx((1.5 + 1.0) / 2)
  s0, s1 = best["samples"]
  assert (s0["reward"], s1["reward"]) == (pytest.approx(1.5), pytest.approx(1.0))
  # GRPO: (s - mean) / (std_{N-1} + eps): +-0.25 / 0.35355
  assert s0["advantage"] == pytest.approx(0.25 / np.sqrt(0.125), rel=1e-4)
  assert s1["advantage"] == pytest.approx(-0.25 / np.sqrt(0.125), rel=1e-4)
  assert s0["rewards"] == {"a/x": 1.0, "b/y": 1.0} and s0["evidence"] == {"a/x": {"i": 4}}
  assert groups[1]["samples"][0]["stop"] == "stop" and groups[1]["samples"][0]["tokens"] == 3
  assert groups[1]["samples"][1]["stop"] == "length"
  worst = groups[2]["samples"][1]
  assert worst["reward"] is None or np.isnan(worst["reward"])
  assert worst["rewards"]["b/y"] is None and worst["valid"] == {"a/x": True, "b/y": False}
  rec.write(4, groups)
  lines = (tmp_path / "rollouts" / "step_000004.jsonl").read_text().splitlines()
  rows = [_strict(line) for line in lines]  # strict JSON: NaN is null
  assert len(rows) == 3 and rows[2]["samples"][1]["reward"] is None and rows[2]["samples"][1]["advantage"] is None
  assert rows[0]["media"] == "img/2.png" and rows[0]["prompt"] == "Describe the image." and rows[0]["step"] == 4
  assert [r["reference"] for r in rows] == ["ref 2", "ref 0", "ref 3"]


def test_long_fields_are_cut_and_resume_drops_later_steps(tmp_path):
  rec = _recorder(tmp_path, groups=1, max_chars=16)
  records = [ImageRecord(id="r0", image="a.png")]
  batch = _batch([[1, 1], [0, 0]], np.ones((2, 2), bool))
  batch = RewardBatch(**{**batch.__dict__, "evidence": ({"a/x": {"claims": list(range(100))}}, {})})
  groups = rec.groups_of(2, records, ["word " * 50, "short"], batch, np.zeros((2, 4), int), np.array([4, 4]))
  caption = groups[0]["samples"][0]["caption"]
  assert caption.startswith("word word word w") and caption.endswith("[+234 chars]")
  assert len(groups[0]["samples"][0]["evidence"]["a/x"]["claims"]) == 65  # 64 kept and a note
  for step in (2, 4, 6, 8):
    rec.write(step, groups)
  rec.resume(4)  # restored at RL step 4: steps 6 and 8 will be written again
  assert recorded_steps(tmp_path / "rollouts") == [2, 4]
  assert rec.wants(6) and not rec.wants(5)
  seen = []
  rec.sinks.append(lambda step, g: seen.append((step, len(g))))
  rec(6, records, ["a", "b"], batch, np.zeros((2, 4), int), np.array([4, 4]))
  rec(7, records, ["a", "b"], batch, np.zeros((2, 4), int), np.array([4, 4]))
  assert seen == [(6, 1)] and recorded_steps(tmp_path / "rollouts") == [2, 4, 6]


def test_caprl_evidence_names_each_question_and_whether_the_letter_was_right():
  reward = CapRLReward(W.judge())
  batch = reward([W.CAPTIONS["complete"], W.CAPTIONS["empty"]], [W.record()], step=0)
  for i in range(2):
    asked = batch.evidence[i]["caprl/accuracy"]["questions"]
    assert len(asked) == reward.config.questions_per_caption
    share = np.mean([q["correct"] for q in asked])
    assert share == pytest.approx(batch.values[i, 0])
    assert all(q["gold"] in "ABCDEFGHI" and q["question"] for q in asked)
    answers = {q.question: q.answer for q in W.record().questions}
    for q in asked:  # each letter names its option: the gold letter's option text is the question's answer
      assert (
        len(q["labels"]) == len(q["options"]) and q["options"][q["labels"].index(q["gold"])] == answers[q["question"]]
      )


def test_rubicap_and_balcaprl_evidence_agree_with_their_rewards():
  from jaxcap.rewards.balcaprl import BalCapRLReward
  from jaxcap.rewards.rubicap import RubiCapReward
  from jaxcap.rewards.rubric import RubricJob, synthesize_rubrics

  student = "There is a red circle at the bottom. A yellow diamond is on the left."
  (outcome,) = synthesize_rubrics(W.judge(), [RubricJob(W.SCENE.id, tuple(W.TEACHERS.values()), student)])
  rubric = outcome.rubric
  assert len(rubric.criteria) >= 2
  captions = [W.CAPTIONS["partial"], W.CAPTIONS["complete"]]
  batch = RubiCapReward(W.judge())(captions, [W.record(rubric=rubric)])
  for i in range(2):
    checked = batch.evidence[i]["rubicap/pass_rate"]["criteria"]
    assert [c["criterion"] for c in checked] == [c.text for c in rubric.criteria]
    rate = sum(c["weight"] * c["passed"] for c in checked) / sum(c["weight"] for c in checked)
    assert batch.valid[i, 0] and rate == pytest.approx(batch.values[i, 0])
  batch = BalCapRLReward(W.judge())([W.HALLUCINATED, W.CAPTIONS["partial"]], [W.record()])
  for i in range(2):
    said = batch.evidence[i]["balcaprl"]
    holds = [c["correct"] and c["pointable"] for c in said["claims"]]
    assert sum(holds) / len(holds) == pytest.approx(batch.values[i, 0])
    assert np.mean([u["covered"] for u in said["units"]]) == pytest.approx(batch.values[i, 1])
    scores = [(said["language"][k] - 1) / 9 for k in ("clarity", "fluency", "coherence")]
    assert np.mean(scores) == pytest.approx(batch.values[i, 2])
