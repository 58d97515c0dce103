import numpy as np
import pytest

from jaxcap.judges.protocol import ClaimSplit, ClaimVerdicts, Coverage, LanguageRatings
from jaxcap.rewards.balcaprl import NAMES, BalCapRLReward
from jaxcap.data.records import ImageRecord
import rewards_world as W


class Scripted:
  """Claims c1..c5: c1-c3 correct and pointable, c4 wrong, c5 correct but not pointable."""

  def __init__(self, fail=()):
    self.fail = fail

  def split_claims(self, requests):
    return [
      ClaimSplit(failed="split" in self.fail, claims=("c1", "c2", "c3", "c4", "c5") if r.caption else ())
      for r in requests
    ]

  def verify_claims(self, requests):
    return [
      ClaimVerdicts(
        failed="verify" in self.fail, correct=(True, True, True, False, True), pointable=(True, True, True, True, False)
      )
      for r in requests
    ]

  def match_reference_units(self, requests):
    return [Coverage(failed="coverage" in self.fail, covered=(True, False, True, False)) for r in requests]

  def rate_language(self, requests):
    return [LanguageRatings(failed="language" in self.fail, clarity=7, fluency=10, coherence=4) for r in requests]


REC = ImageRecord("img", reference_caption="four words long here", reference_units=("u1", "u2", "u3", "u4"))


def test_formulas_hand_computed():
  batch = BalCapRLReward(Scripted())(["some caption text", ""], [REC])
  assert batch.names == NAMES
  np.testing.assert_allclose(batch.values[0], [3 / 5, 2 / 4, ((7 - 1) + (10 - 1) + (4 - 1)) / 27])
  np.testing.assert_allclose(batch.values[1, 0], 0.0)  # no claims: precision 0, not a perfect 1
  np.testing.assert_allclose(batch.weights, [0.1, 0.3, 0.3])
  np.testing.assert_array_equal(batch.caption_lengths, [3, 0])
  np.testing.assert_array_equal(batch.reference_lengths, [4, 4])


@pytest.mark.parametrize(
  "fail, masked_column, primitive",
  [
    ("split", 0, "split_claims"),
    ("verify", 0, "verify_claims"),
    ("coverage", 1, "match_reference_units"),
    ("language", 2, "rate_language"),
  ],
)
def test_each_dimension_is_masked_independently(fail, masked_column, primitive):
  batch = BalCapRLReward(Scripted(fail={fail}))(["caption", "other"], [REC])
  expected = np.ones(3, bool)
  expected[masked_column] = False
  assert (batch.valid == expected).all()
  assert batch.failed_judgments == {primitive: 2}


def test_reference_units_derived_when_missing():
  rec = W.record()
  batch = BalCapRLReward(W.judge())([W.REFERENCE], [rec])
  np.testing.assert_allclose(batch.values[0], [1.0, 1.0, 1.0])


def test_ranking_and_hacks():
  rec = W.record()
  captions = [
    W.REFERENCE,
    W.CAPTIONS["partial"],
    W.CAPTIONS["wrong"],
    W.CAPTIONS["empty"],
    W.HALLUCINATED,
    W.META,
    "There is a large red circle in the top left. " * 10,
    W.INJECTION,
  ]
  values = BalCapRLReward(W.judge())(captions, [rec]).values
  complete, partial, wrong, empty, hallucinated, meta, repeated, injection = values
  weighted = values @ np.array([0.1, 0.3, 0.3])
  assert weighted[0] > weighted[1] > max(weighted[2], weighted[3])
  assert complete[1] > partial[1] > wrong[1] == empty[1] == 0.0  # recall ranks by coverage
  assert complete[0] == partial[0] == 1.0 > wrong[0] == 0.0  # precision: correctness, not coverage
  assert hallucinated[0] < complete[0] and hallucinated[1] == complete[1]
  assert meta[0] == 0.0 and injection[0] == 0.0  # meta-commentary / instructions are never pointable
  assert repeated[1] == partial[1]  # repeating a true fact gains no recall
  assert repeated[2] < partial[2]  # ... and costs fluency
  assert empty[2] == 0.0


def test_garbled_words_cost_linguistic_quality():
  """Stuttering a phrase ("in the the the left") drops the position claim, and with it a wrong claim's
  precision penalty; the language rating must make that cost more than it saves."""
  from jaxcap.world.language_rating import language_ratings

  clean = "The image shows one object on a grey background. A large red circle is in the top left."
  garbled = "The image shows one object on a grey background. A large red circle is in the the the left."
  assert language_ratings(clean) == {"clarity": 10.0, "fluency": 10.0, "coherence": 10.0}
  rated = language_ratings(garbled)
  assert rated["fluency"] == 6.0 and rated["clarity"] == 8.0 and rated["coherence"] == 10.0
  assert language_ratings("The the circle is red.")["fluency"] < 10.0  # case does not hide it
  assert language_ratings("There is a large circle. The circle is red.")["fluency"] == 10.0  # no adjacent repeat
