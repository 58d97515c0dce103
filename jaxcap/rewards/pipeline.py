"""The run's reward, built once from its config: the families' mix, BalCapRL's length mask, the judge failure
budget, and judging off the training loop's thread. Each wrapper is a `RewardStage`:

    RewardMix  ->  LengthMaskedReward (rl.length_mask.dims)  ->  OverlongPenalty (rl.overlong.buffer)
               ->  BudgetedReward (judge.min_valid_fraction)
               ->  OverlappedReward (submit / result)

`evaluation` is the reward as RL optimises it (the mix and its mask) for held-out evaluation, which must neither
spend the training run's failure budget nor queue behind its rollouts; `train` is the whole chain.
"""

from __future__ import annotations

import dataclasses
from typing import Any


from jaxcap.judges.protocol import Judge
from jaxcap.rewards.batch import RewardFunction
from jaxcap.rewards.budget import judged_reward
from jaxcap.rewards.length_mask import LengthMaskedReward
from jaxcap.rewards.mix import build_reward
from jaxcap.rewards.overlap import OverlappedReward
from jaxcap.rewards.overlong import OverlongPenalty


@dataclasses.dataclass(frozen=True)
class RewardPipeline:
  """`train`: what RL steps submit captions to (`submit(...).result()`, then `settle()`); `evaluation`: the same
  reward, called in place."""

  train: OverlappedReward
  evaluation: RewardFunction

  @property
  def names(self) -> tuple[str, ...]:
    return self.train.names

  def close(self) -> None:
    self.train.close()


def masked_reward(config, judge: Judge | Any, tokenize=None) -> RewardFunction:
  """`config`: the run config (jaxcap.config.run.Run). The run's reward families (`reward` block) with the length mask of `rl.length_mask` when it names dims, and
  DAPO's overlong penalty (`rl.overlong`) when its buffer is > 0. `tokenize` (str -> the student's token ids) counts
  caption tokens for the overlong penalty and the families that use it (`caption_length`)."""
  reward = build_reward(dict(config.reward), judge, tokenize)
  lm = config.rl.length_mask
  if lm.dims:
    reward = LengthMaskedReward(reward, list(lm.dims), tau_low=lm.tau_low, tau_high=lm.tau_high)
  ol = config.rl.overlong
  if ol.buffer > 0:
    if tokenize is None:
      raise ValueError("rl.overlong.buffer > 0 counts caption tokens: build the reward with a tokenize function")
    max_len = config.sampling.max_new_tokens
    reward = OverlongPenalty(reward, tokenize, max_len=max_len, buffer=ol.buffer, penalty=ol.penalty)
  return reward


def build_reward_pipeline(config, judge: Judge | Any, tokenize=None) -> RewardPipeline:
  """The pipeline of a run config (`reward`, `rl.length_mask`, `rl.overlong`, `judge` blocks) over `judge`."""
  reward = masked_reward(config, judge, tokenize)
  return RewardPipeline(train=OverlappedReward(judged_reward(reward, judge, config.judge)), evaluation=reward)
