"""Any weighted mix of reward functions as one named reward vector, and a config-driven factory.

Example config (weights scale each component's own weights, e.g. BalCapRL's 0.1/0.3/0.3):
    {"caprl": {"weight": 1.0, "preset": "released_code"},
     "balcaprl": {"weight": 1.0},
     "rubicap": {"weight": 0.5},
     "likert_direct": {"weight": 0.2}}
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from jaxcap.data.records import ImageRecord, align_records
from jaxcap.judges.protocol import Judge
from jaxcap.rewards.batch import RewardBatch, RewardFunction, positioned
from jaxcap.rewards.families import REWARD_FAMILIES


class RewardMix:
  """Runs each component on the same captions and concatenates their columns; weights are scaled."""

  def __init__(self, components: Sequence[tuple[RewardFunction, float]]):
    if not components:
      raise ValueError("RewardMix needs at least one (reward function, weight) pair.")
    self.components = list(components)
    self.names = tuple(n for fn, _ in self.components for n in fn.names)
    if len(set(self.names)) != len(self.names):
      raise ValueError(f"Duplicate reward names {self.names}; give components distinct names.")

  def __call__(
    self, captions: Sequence[str], records: Sequence[ImageRecord], *, step: int = 0, first: int = 0
  ) -> RewardBatch:
    records = align_records(captions, records)
    return RewardBatch.concatenate(
      [fn(captions, records, step=step, **positioned(first)) for fn, _ in self.components],
      [w for _, w in self.components],
    )


def build_reward(
  config: Mapping[str, Mapping[str, Any]], judge: Judge, tokenize: Callable[[str], Sequence[int]] | None = None
) -> RewardMix:
  """A RewardMix from {reward family: {"weight": w, **family options}} (families: `REWARD_FAMILIES`); `tokenize`
  (str -> the student's token ids) for the families that count caption tokens."""
  components = []
  for name, options in config.items():
    options = dict(options)
    weight = float(options.pop("weight", 1.0))
    family = REWARD_FAMILIES[name]
    if family.uses_tokenizer:
      if tokenize is None:
        raise ValueError(f"reward.{name} counts caption tokens: build the reward with the student's tokenize")
      options["tokenize"] = tokenize
    components.append((family.build(judge, **options), weight))
  return RewardMix(components)
