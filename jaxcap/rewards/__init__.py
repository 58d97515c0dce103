"""Rewards for caption RL: CapRL, RubiCap, BalCapRL, Likert baselines and mixes through the judge protocol; rule
rewards that need no judge (CapRL++'s timestamp format and caption length) and plain Python functions.

The training loop calls any reward function as
    batch = reward_fn(captions, records, step=step)   # captions [B*G], records [B*G] or [B]
and reads batch.values [B*G, R], batch.valid [B*G, R], batch.names, batch.weights [R],
batch.caption_lengths / batch.reference_lengths [B*G]. Reward families register themselves in
`REWARD_FAMILIES` when their module is imported; importing this package imports them all.
"""

# the families first, in the order configs and messages list them
from jaxcap.rewards.caprl import CapRLConfig, CapRLReward
from jaxcap.rewards.rubicap import RubiCapConfig, RubiCapReward
from jaxcap.rewards.balcaprl import BalCapRLConfig, BalCapRLReward
from jaxcap.rewards.likert import LikertReward
from jaxcap.rewards.timestamps import TimestampFormatConfig, TimestampFormatReward, timestamp_format_score
from jaxcap.rewards.caption_length import CaptionLengthConfig, CaptionLengthReward, length_window
from jaxcap.rewards.python_fn import PythonReward
from jaxcap.rewards.batch import RewardBatch, RewardFunction
from jaxcap.rewards.families import REWARD_FAMILIES, RewardFamily, RLStart, reward_family
from jaxcap.rewards.length_mask import LengthMaskedReward
from jaxcap.rewards.mix import RewardMix, build_reward
from jaxcap.rewards.rubric import RubricJob, RubricStore, RubricSynthesisConfig, synthesize_rubrics

__all__ = [
  "BalCapRLConfig", "BalCapRLReward", "CapRLConfig", "CapRLReward", "LengthMaskedReward", "LikertReward",
  "REWARD_FAMILIES", "RLStart", "RewardBatch", "RewardFamily", "RewardFunction", "RewardMix", "RubiCapConfig",
  "PythonReward", "RubiCapReward", "RubricJob", "RubricStore", "RubricSynthesisConfig", "TimestampFormatConfig",
  "TimestampFormatReward", "build_reward", "length_window", "reward_family", "synthesize_rubrics",
  "timestamp_format_score",
]  # fmt: skip
