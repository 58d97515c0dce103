import numpy as np
import pytest

from jaxcap.judges.protocol import MultipleChoiceReply
from jaxcap.rewards.caprl import RELEASED_CANNOT_ANSWER, CapRLConfig, CapRLReward, parse_choice
from jaxcap.data.records import ImageRecord, MultipleChoiceQuestion
import rewards_world as W

Q1 = MultipleChoiceQuestion("q1", "What colour is the ball?", ("red", "green", "blue", "black"), "red")
Q2 = MultipleChoiceQuestion("q2", "How many balls?", ("1", "2", "3", "4"), "2")


class PicksText:
  """Scripted judge: always picks the option whose text is in `favourites` (else the last option)."""

  def __init__(self, favourites, fail_questions=()):
    self.favourites, self.fail_questions, self.requests = favourites, fail_questions, []

  def answer_multiple_choice(self, requests):
    self.requests.extend(requests)
    out = []
    for r in requests:
      if r.question in self.fail_questions:
        out.append(MultipleChoiceReply(failed=True, error="scripted"))
        continue
      idx = next((i for i, o in enumerate(r.options) if o in self.favourites), len(r.options) - 1)
      out.append(MultipleChoiceReply(reply=" " + "ABCDEFGHI"[idx] + "."))
    return out


def test_parse_choice_modes():
  opts = ("red", "green", "blue")
  assert parse_choice("B", opts, "exact") == 1
  assert parse_choice("The answer is C.", opts, "exact") == 2
  assert parse_choice("green", opts, "exact") == 1
  assert parse_choice("B or C", opts, "exact") is None  # not an exact match
  assert parse_choice(" B or C", opts, "first_letter") == 1
  assert parse_choice("nothing", opts, "first_letter") is None
  assert parse_choice("I think", opts, "first_letter") is None  # "I" is a letter beyond the options


def test_mean_accuracy_hand_computed_with_shuffled_options():
  # The judge gets Q1 right ("red") and Q2 wrong (it picks "4"): accuracy 1/2 whatever the shuffles.
  judge = PicksText({"red", "4"})
  rec = ImageRecord("img", questions=(Q1, Q2))
  reward = CapRLReward(judge, CapRLConfig(questions_per_caption=2))
  batch = reward(["a caption"] * 3, [rec], step=7)
  np.testing.assert_allclose(batch.values[:, 0], 0.5)
  assert batch.valid.all() and batch.names == ("caprl/accuracy",)
  orders = {r.options for r in judge.requests if r.question == Q1.question}
  assert len(orders) > 1, "options must be reshuffled per draw"
  assert all(sorted(o) == sorted(Q1.options) for o in orders)


def test_released_code_preset_appends_cannot_answer_and_scales_by_two():
  judge = PicksText({"red", "2"})
  reward = CapRLReward(judge, CapRLConfig.released_code())
  batch = reward(["c"], [ImageRecord("img", questions=(Q1, Q2))])
  assert len(judge.requests) == 8  # 8 draws with replacement from only 2 questions
  assert all(r.options[-1] == RELEASED_CANNOT_ANSWER for r in judge.requests)
  np.testing.assert_allclose(batch.values, [[2.0]])


def test_choosing_cannot_answer_scores_zero():
  judge = PicksText({RELEASED_CANNOT_ANSWER})
  batch = CapRLReward(judge, CapRLConfig.released_code())(["c"], [ImageRecord("img", questions=(Q1,))])
  assert batch.valid.all() and batch.values[0, 0] == 0.0


def test_failed_answers_are_masked_and_counted_not_zero():
  rec = ImageRecord("img", questions=(Q1, Q2))
  # Q2 always fails: the mean is over the answered Q1 (correct), 1.0, not (1 + 0) / 2.
  batch = CapRLReward(PicksText({"red"}, {Q2.question}), CapRLConfig(questions_per_caption=2))(["c"], [rec])
  assert batch.valid[0, 0] and batch.values[0, 0] == 1.0
  assert batch.failed_judgments == {"answer_multiple_choice": 1}
  # Every answer fails: masked, counted.
  both = {Q1.question, Q2.question}
  batch = CapRLReward(PicksText({"red"}, both), CapRLConfig(questions_per_caption=2))(["c", "d"], [rec])
  assert not batch.valid.any() and batch.masked_counts == {"caprl/accuracy": 2}
  assert batch.failed_judgments == {"answer_multiple_choice": 4}
  # No questions at all: masked.
  assert not CapRLReward(PicksText(set()))(["c"], [ImageRecord("none")]).valid.any()


def test_injected_judge_failures_mask_rewards():
  rec = W.record()
  captions = [W.REFERENCE] * 40
  reward = CapRLReward(
    W.judge(failure_rate=0.5, seed=3), CapRLConfig(questions_per_caption=4, min_answered_fraction=1.0)
  )
  batch = reward(captions, [rec])
  assert 0 < batch.valid.sum() < 40
  assert batch.failed_judgments["answer_multiple_choice"] > 0
  # A masked entry is a placeholder, and valid ones keep the honest caption's perfect score.
  assert (batch.values[batch.valid] == 1.0).all()


def test_ranking_complete_partial_wrong_empty_and_injection():
  rec = W.record()
  n = len(rec.questions)
  for config in (CapRLConfig(questions_per_caption=n), CapRLConfig.released_code(questions_per_caption=n)):
    values = CapRLReward(W.judge(), config)(list(W.CAPTIONS.values()) + [W.INJECTION], [rec]).values[:, 0]
    complete, partial, wrong, empty, injection = values
    assert complete == config.reward_scale
    assert complete > partial > wrong == empty == 0.0
    assert injection <= empty


def test_deterministic_per_seed_and_step():
  rec = W.record()
  a = PicksText(set())
  b = PicksText(set())
  c = PicksText(set())
  CapRLReward(a, CapRLConfig(seed=1))(["x", "y"], [rec], step=3)
  CapRLReward(b, CapRLConfig(seed=1))(["x", "y"], [rec], step=3)
  CapRLReward(c, CapRLConfig(seed=1))(["x", "y"], [rec], step=4)
  assert a.requests == b.requests
  assert a.requests != c.requests


def test_rule_judge_answer_is_invariant_to_option_order():
  judge = W.judge()
  from jaxcap.judges.protocol import MultipleChoiceRequest

  for q in W.curated_questions():
    for caption in (W.REFERENCE, "", W.CAPTIONS["partial"]):
      picked = set()
      for perm in np.random.default_rng(0).permuted(np.tile(np.arange(len(q.options)), (6, 1)), axis=1):
        options = tuple(q.options[i] for i in perm)
        reply = judge.answer_multiple_choice([MultipleChoiceRequest("hand", caption, q.question, options)])[0]
        picked.add(options["ABCDEFGHI".index(reply.reply)])
      assert len(picked) == 1, (q.question, caption, picked)


def test_bad_config_is_rejected():
  with pytest.raises(ValueError, match="answer_parsing"):
    CapRLConfig(answer_parsing="fuzzy")
