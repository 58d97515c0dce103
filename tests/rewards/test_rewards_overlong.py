"""DAPO's soft overlong penalty (verl's DAPO reward manager formula, hand-computed) and its reward wrapper; the
wrapper adds one always-valid dimension and leaves the others alone."""

import numpy as np
import pytest

from jaxcap.data.records import ImageRecord
from jaxcap.rewards.batch import make_batch
from jaxcap.rewards.overlong import OverlongPenalty
from jaxcap.rl.masks import overlong_penalty


def _verl_dapo(valid_response_length, max_resp_len, buffer_len, factor):
  """verl/workers/reward_manager/dapo.py, the overlong_buffer branch."""
  expected_len = max_resp_len - buffer_len
  exceed_len = valid_response_length - expected_len
  return min(-exceed_len / buffer_len * factor, 0)


def test_penalty_equals_verl_and_hand_values():
  lengths = np.arange(0, 50)
  got = overlong_penalty(lengths, max_len=48, buffer=8, penalty=0.5)
  np.testing.assert_allclose(got, [_verl_dapo(n, 48, 8, 0.5) for n in lengths], rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(overlong_penalty([40, 44, 48], 48, 8, 1.0), [0.0, -0.5, -1.0])
  with pytest.raises(ValueError, match="rl.overlong.buffer"):
    overlong_penalty([1], 48, 0, 1.0)


class _Fixed:
  names = ("a",)

  def __call__(self, captions, records, *, step=0):
    return make_batch(self.names, np.full((len(captions), 1), 0.7, np.float32), np.ones((len(captions), 1), bool),
                      [2.0], captions, records, {})  # fmt: skip


def test_wrapper_adds_an_overlong_dimension():
  records = [ImageRecord(id="x", image="x.png", reference_caption="r")] * 3
  captions = ["w " * 3, "w " * 6, "w " * 20]  # 3, 6, 20 tokens + the stop token, capped at 10
  reward = OverlongPenalty(_Fixed(), lambda s: s.split(), max_len=10, buffer=4, penalty=1.0)
  batch = reward(captions, records)
  assert reward.names == batch.names == ("a", "overlong")
  np.testing.assert_allclose(batch.values, [[0.7, 0.0], [0.7, -0.25], [0.7, -1.0]])
  assert batch.valid.all()
  np.testing.assert_allclose(batch.weights, [2.0, 1.0])
  assert batch.extras["overlong/in_buffer"] == pytest.approx(2 / 3)
  with pytest.raises(ValueError, match="rl.overlong.buffer"):
    OverlongPenalty(_Fixed(), str.split, max_len=10, buffer=11, penalty=1.0)
