"""Streaming judging (jaxcap.rewards.streaming): a step's groups judged one by one as they arrive, in any order, give
the RewardBatch of one call on the whole batch (values, masks, evidence, failure counts, extras) and feed the failure
budget the same judgments; a stream whose rollout stopped ends instead of holding the judge's thread."""

import dataclasses
import random
import threading

import numpy as np
import pytest

from jaxcap.judges.settings import JudgeConfig
from jaxcap.rewards.balcaprl import BalCapRLReward
from jaxcap.rewards.batch import stack_rows
from jaxcap.rewards.budget import JudgeFailureBudgetError, judged_reward
from jaxcap.rewards.caprl import CapRLConfig, CapRLReward
from jaxcap.rewards.length_mask import LengthMaskedReward
from jaxcap.rewards.mix import RewardMix
from jaxcap.rewards.overlap import OverlappedReward
from jaxcap.rewards.overlong import OverlongPenalty
from jaxcap.rewards.streaming import StreamCancelled
from jaxcap.world.judge import RuleBasedJudge
from rewards_world import CAPTIONS, HALLUCINATED, META, REFERENCE, SCENE, record

B, G = 5, 4


def _records():
  return [record(id=f"img{b}") for b in range(B)]


def _captions():
  pool = [*CAPTIONS.values(), HALLUCINATED, META, REFERENCE + " " + META]
  rng = random.Random(0)
  return [rng.choice(pool) for _ in range(B * G)]


def _reward(failure_rate: float, min_valid: float = 0.5, patience: int = 3) -> tuple[OverlappedReward, RuleBasedJudge]:
  """The run's chain over a fresh judge: CapRL (released-code draws, keyed by caption index) + BalCapRL, the length
  mask on BalCapRL's linguistic reward, DAPO's overlong penalty, the failure budget, off the caller's thread."""
  judge = RuleBasedJudge({f"img{b}": SCENE for b in range(B)}, failure_rate=failure_rate, seed=3)
  mix = RewardMix([(CapRLReward(judge, CapRLConfig.released_code()), 1.0), (BalCapRLReward(judge), 0.5)])
  masked = LengthMaskedReward(mix, ["balcaprl/linguistic"], tau_low=0.5, tau_high=1.5)
  overlong = OverlongPenalty(masked, str.split, max_len=24, buffer=8, penalty=1.0)
  budget = JudgeConfig(min_valid_fraction=min_valid, failure_patience=patience)
  return OverlappedReward(judged_reward(overlong, judge, budget), group_workers=3), judge


def _assert_same(got, want):
  assert got.names == want.names
  for field in ("values", "valid", "weights", "caption_lengths", "reference_lengths"):
    np.testing.assert_array_equal(getattr(got, field), getattr(want, field), err_msg=field)
  assert got.failed_judgments == want.failed_judgments
  assert got.extras == pytest.approx(want.extras, nan_ok=True) and list(got.extras) == list(want.extras)
  assert got.evidence == want.evidence


def _stream(reward, records, captions, step, order):
  stream = reward.stream(records, group_size=G, step=step)

  def feed():  # from another thread, as the paged engine's host loop hands groups over
    for b in order:
      stream.add(b, captions[b * G : (b + 1) * G])

  t = threading.Thread(target=feed)
  t.start()
  t.join()
  return stream.result()


def test_groups_in_any_order_give_the_whole_batchs_rewards():
  records, captions = _records(), _captions()
  whole, judge_a = _reward(failure_rate=0.2)
  streamed, judge_b = _reward(failure_rate=0.2)
  with whole, streamed:
    for step, order in ((0, [3, 0, 4, 1, 2]), (1, [0, 1, 2, 3, 4])):
      want = whole.submit(captions, records, step=step).result()
      got = _stream(streamed, records, captions, step, order)
      _assert_same(got, want)
      assert sum(want.failed_judgments.values()) > 0 and not want.valid.all()  # failures masked and counted
      assert want.extras["judge/valid_fraction"] < 1.0
  # the failure budget saw the same judgments: same counts asked / failed, same streak
  assert judge_a.judgment_counts() == judge_b.judgment_counts()
  budget = lambda r: vars(r.inner.budget)
  assert budget(whole) == budget(streamed)


def test_the_failure_budget_stops_a_streamed_run_as_it_stops_a_whole_one():
  records, captions = _records(), _captions()
  for judged in ("whole", "streamed"):
    reward, _ = _reward(failure_rate=0.9, min_valid=0.5, patience=2)
    with reward:
      run = lambda step: (
        reward.submit(captions, records, step=step).result()
        if judged == "whole"
        else _stream(reward, records, captions, step, range(B))
      )
      run(0)
      with pytest.raises(JudgeFailureBudgetError, match="for 2 consecutive RL steps"):
        run(1)


def test_a_cancelled_stream_raises_and_the_next_one_is_judged():
  records, captions = _records(), _captions()
  reward, _ = _reward(failure_rate=0.0)
  with reward:
    stream = reward.stream(records, group_size=G, step=0)
    stream.add(1, captions[G : 2 * G])
    stream.cancel()
    with pytest.raises(StreamCancelled, match="after 1 of 5 groups"):
      stream.result()
    want = reward.submit(captions, records, step=1).result()
    _assert_same(_stream(reward, records, captions, 1, range(B)), want)


def test_stack_rows_refuses_parts_it_cannot_join_exactly():
  reward, _ = _reward(failure_rate=0.0)
  with reward:
    part = reward.core(_captions()[:G], _records()[:1], step=0)
    assert stack_rows([part, part]).values.shape == (2 * G, 4)
    with pytest.raises(ValueError, match="carries extras"):
      stack_rows([part, dataclasses.replace(part, extras={"length/in_band": 1.0})])
    with pytest.raises(ValueError, match="parts of different rewards"):
      stack_rows([part, reward(_captions()[:G], _records()[:1])])  # the whole chain's: one more dimension
    stream = reward.stream(_records(), group_size=G)
    with pytest.raises(ValueError, match="expected 4"):
      stream.add(0, ["only one"])
    stream.cancel()
