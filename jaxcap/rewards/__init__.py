"""Rewards for caption RL: CapRL, RubiCap, BalCapRL, Likert baselines and mixes, all through the judge protocol.

The training loop calls any reward function as
    batch = reward_fn(captions, records, step=step)   # captions [B*G], records [B*G] or [B]
and reads batch.values [B*G, R], batch.valid [B*G, R], batch.names, batch.weights [R],
batch.caption_lengths / batch.reference_lengths [B*G].
Names below are imported lazily: `jaxcap.rewards.record` is shared with the judges, which the reward
modules import in turn.
"""

import importlib

_EXPORTS = {
  "BalCapRLConfig": "balcaprl",
  "BalCapRLReward": "balcaprl",
  "RewardBatch": "batch",
  "RewardFunction": "batch",
  "CapRLConfig": "caprl",
  "CapRLReward": "caprl",
  "LikertReward": "likert",
  "RewardMix": "mix",
  "build_reward": "mix",
  "Criterion": "record",
  "ImageRecord": "record",
  "MultipleChoiceQuestion": "record",
  "Rubric": "record",
  "RubiCapConfig": "rubicap",
  "RubiCapReward": "rubicap",
  "RubricJob": "rubric",
  "RubricStore": "rubric",
  "RubricSynthesisConfig": "rubric",
  "synthesize_rubrics": "rubric",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
  if name not in _EXPORTS:
    raise AttributeError(f"module 'jaxcap.rewards' has no attribute {name!r}")
  return getattr(importlib.import_module(f"jaxcap.rewards.{_EXPORTS[name]}"), name)
