"""The reward-family registry: each family is one builder function plus one decorator, in its own module.

    @reward_family("caprl", options=CapRLConfig, extra_options=("preset",))
    def caprl_reward(judge, *, preset="paper", **options) -> RewardFunction: ...

A config's `reward` block names families and their options ({"caprl": {"weight": 1.0, "preset": "paper"}});
`jaxcap.rewards.mix.build_reward` builds them and `jaxcap.config_files.validate` checks the names and options
against this registry. A family that needs no judge says so (`needs_judge=False`: it may run with judge.kind='none'); one that counts
caption tokens takes the student's tokenizer (`uses_tokenizer=True`: built with `tokenize=`, str -> token ids).
A family may also hook into the run:
  prepare_records(run_config, records) -> records   when the run's records are read (e.g. drop stale rubrics)
  before_rl(RLStart) -> (train_records, eval_records) as RL starts or resumes (e.g. write rubrics against the
                                                      policy entering RL); return the same lists when unchanged
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Sequence

from jaxcap.data.records import ImageRecord
from jaxcap.judges.protocol import Judge
from jaxcap.registry import Registry


@dataclasses.dataclass(frozen=True)
class RLStart:
  """What a family's `before_rl` hook sees: the run about to start (or resume) RL."""

  config: Any  # the run config
  workdir: Path
  judge: Judge
  train_records: list[ImageRecord]
  eval_records: list[ImageRecord]
  captions: Callable[[Sequence[ImageRecord], int], list[str]]  # greedy captions (records, batch size) of the policy
  step: int  # the RL step the run starts at (> 0 on resume)


@dataclasses.dataclass(frozen=True)
class RewardFamily:
  build: Callable[..., Any]  # build(judge, **options) -> RewardFunction (and tokenize= when uses_tokenizer)
  options: tuple[str, ...]  # option names accepted besides "weight"
  prepare_records: Callable[[Any, list[ImageRecord]], list[ImageRecord]] | None = None
  before_rl: Callable[[RLStart], tuple[list[ImageRecord], list[ImageRecord]]] | None = None
  needs_judge: bool = True
  uses_tokenizer: bool = False


REWARD_FAMILIES: Registry[RewardFamily] = Registry("reward family", field="reward.{name}")


def reward_family(
  name: str,
  *,
  options: type | Sequence[str] = (),
  extra_options: Sequence[str] = (),
  prepare_records: Callable | None = None,
  before_rl: Callable | None = None,
  needs_judge: bool = True,
  uses_tokenizer: bool = False,
):
  """Registers `build(judge, **options) -> RewardFunction` as reward family `name`. `options`: the accepted
  option names, or a config dataclass whose fields they are; `extra_options` adds names the builder takes."""
  names = tuple(f.name for f in dataclasses.fields(options)) if isinstance(options, type) else tuple(options)

  def register(build: Callable) -> Callable:
    family = RewardFamily(
      build, names + tuple(extra_options), prepare_records, before_rl, needs_judge=needs_judge,
      uses_tokenizer=uses_tokenizer,
    )  # fmt: skip
    REWARD_FAMILIES.register(name, family)
    return build

  return register
