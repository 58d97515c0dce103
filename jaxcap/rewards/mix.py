"""Any weighted mix of reward functions as one named reward vector, and a config-driven factory.

Example config (weights scale each component's own weights, e.g. BalCapRL's 0.1/0.3/0.3):
    {"caprl": {"weight": 1.0, "preset": "released_code"},
     "balcaprl": {"weight": 1.0},
     "rubicap": {"weight": 0.5},
     "likert_direct": {"weight": 0.2}}
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from jaxcap.judges.protocol import Judge
from jaxcap.rewards.balcaprl import BalCapRLConfig, BalCapRLReward
from jaxcap.rewards.batch import RewardBatch, RewardFunction
from jaxcap.rewards.caprl import CapRLConfig, CapRLReward
from jaxcap.rewards.likert import LikertReward
from jaxcap.rewards.record import ImageRecord, align_records
from jaxcap.rewards.rubicap import RubiCapConfig, RubiCapReward
from jaxcap.rewards.rubric import RubricStore

KNOWN_REWARDS = ("caprl", "rubicap", "balcaprl", "likert_direct", "likert_reference")


class RewardMix:
  """Runs each component on the same captions and concatenates their columns; weights are scaled."""

  def __init__(self, components: Sequence[tuple[RewardFunction, float]]):
    if not components:
      raise ValueError("RewardMix needs at least one (reward function, weight) pair.")
    self.components = list(components)
    self.names = tuple(n for fn, _ in self.components for n in fn.names)
    if len(set(self.names)) != len(self.names):
      raise ValueError(f"Duplicate reward names {self.names}; give components distinct names.")

  def __call__(self, captions: Sequence[str], records: Sequence[ImageRecord], *, step: int = 0) -> RewardBatch:
    records = align_records(captions, records)
    return RewardBatch.concatenate(
      [fn(captions, records, step=step) for fn, _ in self.components], [w for _, w in self.components]
    )


def build_reward(
  config: Mapping[str, Mapping[str, Any]], judge: Judge, rubric_store: RubricStore | None = None
) -> RewardMix:
  """A RewardMix from {reward family: {"weight": w, **family options}}; see module docstring."""
  unknown = set(config) - set(KNOWN_REWARDS)
  if unknown:
    raise ValueError(f"Unknown reward families {sorted(unknown)}; known: {KNOWN_REWARDS}.")
  components = []
  for family, options in config.items():
    options = dict(options)
    weight = float(options.pop("weight", 1.0))
    if family == "caprl":
      preset = options.pop("preset", "paper")
      if preset not in ("paper", "released_code"):
        raise ValueError(f"caprl preset {preset!r}: use 'paper' or 'released_code'.")
      fn = CapRLReward(judge, getattr(CapRLConfig, preset)(**options))
    elif family == "rubicap":
      fn = RubiCapReward(judge, RubiCapConfig(**options), store=rubric_store)
    elif family == "balcaprl":
      if "weights" in options:
        options["weights"] = tuple(options["weights"])
      fn = BalCapRLReward(judge, BalCapRLConfig(**options))
    else:
      fn = LikertReward(judge, reference=family == "likert_reference", **options)
    components.append((fn, weight))
  return RewardMix(components)


def config_fields(family: str) -> tuple[str, ...]:
  """Option names a family accepts (besides "weight"), for config validation and docs."""
  cls = {"caprl": CapRLConfig, "rubicap": RubiCapConfig, "balcaprl": BalCapRLConfig}.get(family)
  return tuple(f.name for f in dataclasses.fields(cls)) if cls else ("name",)
