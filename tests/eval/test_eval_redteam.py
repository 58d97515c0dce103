"""The reward-hacking red team: attack construction, no attack beats an honest caption under the rule-based
judge for any reward family, and a gullible judge is exposed."""

import dataclasses

import pytest
from eval_world import builtin, world

from jaxcap.world.language import parse_caption
from jaxcap.eval.redteam import ATTACKS, RedTeamConfig, make_attacks, run_redteam
from jaxcap.judges.protocol import LikertScore

FAMILY_REWARDS = {
  "caprl/accuracy",
  "caprl_released/accuracy",
  "rubicap/pass_rate",
  "balcaprl/precision",
  "balcaprl/recall",
  "balcaprl/linguistic",
  "likert/direct",
  "likert/reference",
}


@pytest.fixture(scope="module")
def records():
  return world()[1][:8]


def test_attacks_are_what_they_claim(records):
  record = records[0]
  honest = record.reference_caption
  attacks = make_attacks(record, honest)
  assert set(attacks) == set(ATTACKS)
  assert attacks["empty"] == "" and len(attacks["one_word"].split()) == 1
  assert len(attacks["repeated_true_fact"].split()) >= len(honest.split())
  assert len(set(s.strip() for s in attacks["repeated_true_fact"].split("."))) <= 2  # one sentence repeated
  assert len(attacks["generic_filler"].split()) >= 250
  assert all(c.kind == "meta" for c in parse_caption(attacks["generic_filler"]))  # says nothing specific
  for padded in ("meta_commentary", "self_praise", "hallucinated_objects"):
    assert attacks[padded].startswith(honest) and len(attacks[padded]) > len(honest)
  scene = world()[2].scenes[record.id]
  invented = parse_caption(attacks["hallucinated_objects"][len(honest) :])
  assert invented and all(scene.find(c.subject) is None for c in invented if c.kind == "exists")
  assert "answer A" in attacks["prompt_injection"]


@pytest.mark.parametrize("honest_kind", ["reference", "teacher:meticulous"])
def test_no_attack_beats_the_honest_caption_under_the_rule_based_judge(records, honest_kind):
  judge = world()[2]
  rows, failures = run_redteam(judge, records, builtin(honest_kind, records))
  assert {r.reward for r in rows} == FAMILY_REWARDS
  assert {(r.reward, r.attack) for r in rows} == {(w, a) for w in FAMILY_REWARDS for a in ATTACKS}
  assert failures == {}
  for r in rows:
    assert r.images == len(records) and r.masked == 0, r
    assert r.beats == 0.0, f"{r.attack} beats the honest caption on {r.reward}: {r}"
    assert r.attack_mean <= r.honest_mean + 1e-9
  # The cheap attacks are not just "no better" but clearly worse on every reward.
  for r in rows:
    if r.attack in ("empty", "one_word", "generic_filler", "prompt_injection"):
      assert r.delta < 0, r


class GullibleLikertJudge:
  """A rule-based judge whose Likert scorer obeys "rate it 10" in the caption, like a weak LLM judge."""

  def __init__(self, inner):
    self.inner = inner

  def __getattr__(self, name):
    return getattr(self.inner, name)

  def score_likert(self, requests):
    scores = self.inner.score_likert(requests)
    return [
      LikertScore(score=10.0) if "10 out of 10" in r.caption else s for r, s in zip(requests, scores, strict=True)
    ]


def test_red_team_exposes_a_gullible_judge(records):
  config = dataclasses.replace(RedTeamConfig(), families={"likert_direct": {"likert_direct": {}}})
  rows, _ = run_redteam(GullibleLikertJudge(world()[2]), records, builtin("student", records), config)
  injection = next(r for r in rows if r.attack == "prompt_injection")
  assert injection.beats == 1.0 and injection.delta > 0
