import numpy as np
import pytest

from jaxcap.rewards.batch import RewardBatch
from jaxcap.rewards.likert import LikertReward
from jaxcap.rewards.mix import build_reward
import rewards_world as W


def test_direct_and_reference_likert_rank_captions():
  rec = W.record()
  captions = list(W.CAPTIONS.values()) + [W.HALLUCINATED]
  direct = LikertReward(W.judge())(captions, [rec]).values[:, 0]
  reference = LikertReward(W.judge(), reference=True)(captions, [rec]).values[:, 0]
  for v in (direct, reference):
    assert v[0] > v[1] > v[3] == 0.0 and v[0] == 1.0
  assert direct[4] < direct[0]  # the image-grounded judge sees the hallucination
  assert reference[4] == reference[0]  # the reference-only judge cannot (why it gets hacked)


def test_reference_likert_masks_records_without_reference():
  batch = LikertReward(W.judge(), reference=True)(["x"], [W.record(reference_caption="")])
  assert not batch.valid.any() and batch.failed_judgments == {"missing_reference": 1}


def test_mix_is_one_named_vector_with_config_weights():
  mix = build_reward(
    {
      "caprl": {"weight": 2.0, "preset": "released_code"},
      "balcaprl": {"weight": 0.5},
      "rubicap": {},
      "likert_direct": {"weight": 0.1},
    },
    W.judge(),
  )
  rec = W.record(rubric=None)
  batch = mix([W.REFERENCE, W.CAPTIONS["partial"]] * 2, [rec, rec])  # one record per image, G = 2
  assert batch.names == (
    "caprl/accuracy",
    "balcaprl/precision",
    "balcaprl/recall",
    "balcaprl/linguistic",
    "rubicap/pass_rate",
    "likert/direct",
  )
  np.testing.assert_allclose(batch.weights, [2.0, 0.05, 0.15, 0.15, 1.0, 0.1])
  assert batch.values.shape == batch.valid.shape == (4, 6)
  assert not batch.valid[:, 4].any()  # no rubric: masked, not 0
  assert batch.failed_judgments["missing_rubric"] == 4
  np.testing.assert_array_equal(batch.caption_lengths[:2], [len(W.REFERENCE.split()), 10])


def test_mix_rejects_unknown_family_and_bad_alignment():
  with pytest.raises(ValueError, match="reward.clip_score: unknown reward family; choose one of caprl, rubicap"):
    build_reward({"clip_score": {}}, W.judge())
  with pytest.raises(ValueError, match="3 captions and 2 records"):
    build_reward({"likert_direct": {}}, W.judge())(["a", "b", "c"], [W.record(), W.record()])


def test_reward_batch_checks_shapes():
  with pytest.raises(ValueError, match="values"):
    RewardBatch(("a",), np.zeros((2, 2)), np.zeros((2, 1), bool), np.ones(1), np.zeros(2), np.zeros(2))
