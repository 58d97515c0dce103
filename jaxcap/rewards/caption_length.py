"""CapRL++'s length reward: 1 up to `full_until` caption tokens, falling linearly to 0 at `zero_at`, 0 beyond;
tokens counted with the student's tokenizer (the released server's REWARD_LENGTH_TOKENIZER_PATH = the caption
model), no special tokens. The released recipe adds 0.2 x this to the reward of images and videos alike
(REWARD_LENGTH_WEIGHT, L1 = 2,048, L2 = 3,072), while captions may run to 4,096 tokens: unlike `rl.overlong`,
whose window always ends at `sampling.max_new_tokens`, the window is set on its own.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from jaxcap.data.records import ImageRecord, align_records
from jaxcap.rewards.batch import RewardBatch, make_batch
from jaxcap.rewards.families import reward_family


@dataclasses.dataclass(frozen=True)
class CaptionLengthConfig:
  full_until: int = 2048  # tokens at which the reward is still 1 (L1)
  zero_at: int = 3072  # tokens at which it has fallen to 0 (L2)
  name: str = "caption_length/score"

  def __post_init__(self):
    if not 0 <= self.full_until <= self.zero_at:
      raise ValueError(
        f"reward.caption_length: need 0 <= full_until ({self.full_until}) <= zero_at ({self.zero_at}) tokens"
      )


def length_window(tokens, full_until: int = 2048, zero_at: int = 3072) -> np.ndarray:
  """The released piecewise reward of token counts `tokens` (any shape): 1 for n <= full_until, then
  1 - (n - full_until) / (zero_at - full_until) down to 0 at zero_at, 0 beyond (a step when the two are equal)."""
  n = np.asarray(tokens, np.float64)
  if zero_at <= full_until:
    return (n <= full_until).astype(np.float32)
  return np.clip(1.0 - (n - full_until) / (zero_at - full_until), 0.0, 1.0).astype(np.float32)


class CaptionLengthReward:
  """Reward [N, 1], always valid; the token count of each caption goes to its evidence."""

  def __init__(self, tokenize: Callable[[str], Sequence[int]], config: CaptionLengthConfig = CaptionLengthConfig()):
    self.tokenize = tokenize
    self.config = config
    self.names = (config.name,)

  def __call__(self, captions: Sequence[str], records: Sequence[ImageRecord], *, step: int = 0) -> RewardBatch:
    records = align_records(captions, records)
    tokens = [len(self.tokenize(c)) for c in captions]
    values = length_window(tokens, self.config.full_until, self.config.zero_at)[:, None]
    evidence = [{self.config.name: {"tokens": n}} for n in tokens]
    return make_batch(self.names, values, np.ones_like(values, bool), [1.0], captions, records, {}, evidence)


@reward_family("caption_length", options=CaptionLengthConfig, needs_judge=False, uses_tokenizer=True)
def caption_length_reward(judge, *, tokenize, **options) -> CaptionLengthReward:
  """CapRL++'s length reward over the student's tokens; needs no judge."""
  return CaptionLengthReward(tokenize, CaptionLengthConfig(**options))
