"""The phases of a run (SFT, then RL): what differs between them, so the trainer's phase loop is written once.

A `Phase` owns its jitted step (built by `RunPrograms` from the config), its train state, the per-step argument
its update takes, its update (`SFTUpdate`; RL's `RLUpdate`: a rollout source and a learner), its evaluation cadence and its start hook. A new phase
kind is one subclass registered in `PHASE_KINDS`. Hooks take the `Trainer` (jaxcap.train.shell.trainer) that runs them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import numpy as np

from jaxcap.config.cli import ConfigError
from jaxcap.registry import Registry
from jaxcap.rewards.families import REWARD_FAMILIES, RLStart
from jaxcap.rl.group_filter import OFF, SPREAD
from jaxcap.train.steps.adapters import trains_base
from jaxcap.train.rollouts.fully_async import FullyAsync
from jaxcap.train.rollouts.placement import WeightSync
from jaxcap.train.steps.programs import reference_is_base, rollout_correction_config, with_reference
from jaxcap.train.rollouts.refill import GroupFilter, RefillGroups
from jaxcap.train.rollouts.source import OnPolicy, RolloutSource
from jaxcap.train.steps.state import phase_train_state
from jaxcap.train.learner.sft import SFTUpdate
from jaxcap.train.learner.rl import RLLearner, RLUpdate

Trainer = Any  # jaxcap.train.shell.trainer.Trainer, which imports this module
PHASE_KINDS: Registry[type["Phase"]] = Registry("training phase")


@dataclasses.dataclass
class Phase:
  """One phase of `steps` updates of `batch_size` records (per process); `index` is its place in the run."""

  name: str
  index: int
  steps: int
  batch_size: int
  checkpoint_base: int  # global checkpoint step of this phase's step 0 (checkpoints are numbered across phases)
  update: Any  # SFTUpdate / RLUpdate: `prepare(records)` feeds the loader, the call runs one step

  eval_every: int = 0  # held-out evaluation within the phase every this many steps (0: only at its start / end)
  checkpoint_every: int = 0  # checkpoint.every: the loop saves after every this many steps (and after the last)
  optimizer: Any = None  # set by `new_state`, from the phase's `optim` block

  @classmethod
  def build(cls, trainer: Trainer, index: int) -> "Phase":
    raise NotImplementedError

  def new_state(self, trainer: Trainer, params, key: jax.Array):
    """A fresh train state around `params` on the run's mesh (the optimizer from the phase's `optim` block)."""
    self.optimizer = trainer.programs.optimizer(self.name)
    reference = with_reference(trainer.config, self.name)
    base = trains_base(trainer.config, self.name)
    return phase_train_state(
      self.optimizer, params, key, trainer.setup.mesh, with_reference=reference, trains_base=base
    )

  def step_fn(self, trainer: Trainer, state) -> Callable:
    """The jitted update, its state donated and kept in `state`'s shardings."""
    shardings = jax.tree.map(lambda x: x.sharding, state)
    return trainer.programs.update(self.name, self.optimizer, shardings)

  def step_arg(self, trainer: Trainer, step: int) -> Any:
    """The argument the update takes besides (step_fn, state, batch)."""
    return step

  def begin(self, trainer: Trainer, state) -> bool:
    """Runs as the phase starts, fresh or resumed (after the restore); True when it changed the records."""
    return False

  def evaluate_at_start(self, trainer: Trainer, state, records_changed: bool) -> None:
    """The held-out evaluation at a fresh start of the phase (if the config asks for one)."""

  def attach(self, loader):
    """Hands the phase its loader (restored, if resuming) before its first step; returns the loader the loop
    draws the steps' batches from."""
    return loader


@PHASE_KINDS.register("sft")
@dataclasses.dataclass
class SFTPhase(Phase):
  """Next-token loss on target captions (`sft` block)."""

  @classmethod
  def build(cls, trainer: Trainer, index: int) -> "SFTPhase":
    c, s = trainer.config, trainer.setup
    update = SFTUpdate(
      trainer.batcher,
      s.sft_targets,
      s.processor.tokenizer,
      s.model.cfg.eos_token_id,
      c.sft.micro_batches,
      c.sft.max_target_tokens,
      micro_batch_tokens=c.sft.micro_batch_tokens,
      packing_min_saving=c.sft.packing_min_saving,
    )
    return cls("sft", index, c.sft.steps, c.sft.batch_size, 0, update)

  def step_arg(self, trainer: Trainer, step: int) -> np.random.Generator:
    # targets drawn from a generator seeded per step, so a resumed run replays them
    return np.random.default_rng([int(trainer.config.seed), self.index, step])

  def evaluate_at_start(self, trainer: Trainer, state, records_changed: bool) -> None:
    if int(state.step) == 0 and trainer.config.eval.at_start:
      trainer.evaluate(state.params, self.name, 0, tag="start")


def schedule_for(config, reward_names: tuple[str, ...], steps: int, checkpoint_every: int, sync=None):
  """The rollout source's schedule the `rl` block chooses: asynchronous (rl.max_staleness; `sync` a `WeightSync`,
  None colocated without partial rollouts), dynamic sampling (rl.filter_groups; the schema refuses both at once) or
  on-policy."""
  rl = config.rl
  if rl.max_staleness:
    thread = bool(config.rollout.devices)  # the rollouts' own devices: a thread drives them
    return FullyAsync(steps, checkpoint_every, rl.max_staleness, sync, partial=rl.partial_rollouts, thread=thread)
  if rl.filter_groups == OFF:
    return OnPolicy()
  if rl.filter_groups != SPREAD and rl.filter_groups not in reward_names:
    raise ConfigError(
      f"rl.filter_groups={rl.filter_groups!r} names no reward dimension of this run; use off, spread or one of "
      f"{list(reward_names)}"
    )
  return RefillGroups(GroupFilter.from_config(rl), patience=int(config.train.collapse_steps))


def weight_sync(trainer: Trainer) -> WeightSync | None:
  """How the learner's weights reach the rollout devices (rollout.devices), or None when they share the learner's
  (partial rollouts, which hold a version across steps, still copy it: onto the learner's own devices)."""
  mesh = trainer.setup.rollout_mesh
  if mesh is None and trainer.config.rl.partial_rollouts:
    mesh = trainer.setup.mesh
  if mesh is None:
    return None
  frozen_base = trainer.config.model.lora.rank > 0 and not trains_base(trainer.config, "rl")
  return WeightSync(mesh, trainer.sampler.cfg.dtype, adapters_only=frozen_base)


def _stop_ids(sampler) -> tuple[int, ...]:
  return tuple(int(i) for i in sampler.sampling.resolve_stop_ids(sampler.cfg.eos_token_id))


@PHASE_KINDS.register("rl")
@dataclasses.dataclass
class RLPhase(Phase):
  """Sample G captions per record -> rewards from the judge -> group advantages -> clipped policy update."""

  @classmethod
  def build(cls, trainer: Trainer, index: int) -> "RLPhase":
    c = trainer.config
    every = int(c.checkpoint.every or 0)
    source = RolloutSource(
      trainer.batcher,
      trainer.sampler,
      trainer.rewards.train,
      c.rl.num_samples,
      c.rl.micro_batches,
      schedule=schedule_for(c, trainer.rewards.names, c.rl.steps, every, weight_sync(trainer)),
      stream_judging=c.rl.stream_judging,
    )
    learner = RLLearner(
      trainer.batcher,
      trainer.programs.logprobs(),
      c.rl.num_samples,
      c.rl.micro_batches,
      c.rl.recompute_old_logprobs,
      rollout_correction=rollout_correction_config(c).enabled,
      stop_ids=_stop_ids(trainer.sampler) if c.rl.mask_truncated else None,
      micro_batch_tokens=c.rl.micro_batch_tokens,
      packing_min_saving=c.rl.packing_min_saving,
      recorder=trainer.rollout_recorder(_stop_ids(trainer.sampler)),
      reference_is_base=reference_is_base(c, "rl"),
    )
    update = RLUpdate(source, learner)
    return cls("rl", index, c.rl.steps, c.rl.batch_size, c.sft.steps, update, c.eval.every, checkpoint_every=every)

  def attach(self, loader):
    """The rollout source draws refills (rl.filter_groups) and look-ahead batches (rl.max_staleness) from the
    phase's loader: its saved position counts them."""
    return self.update.source.attach(loader)

  def begin(self, trainer: Trainer, state) -> bool:
    """The reward families' `before_rl` hooks (e.g. RubiCap writing rubrics against the policy entering RL)."""
    s = trainer.setup
    recorder = self.update.learner.recorder
    if recorder is not None:  # a resumed run writes the steps after its checkpoint again
      recorder.resume(int(state.step))
    changed = False
    for name in trainer.config.reward:
      hook = REWARD_FAMILIES[name].before_rl
      if hook is None:
        continue
      captions = lambda records, batch_size: trainer.heldout.captions(state.params, records, batch_size)[0]
      run = RLStart(
        trainer.config, trainer.rundir.path, s.judge, s.train_records, s.eval_records, captions, int(state.step)
      )
      train, held_out = hook(run)
      changed |= train is not s.train_records or held_out is not s.eval_records
      s.train_records, s.eval_records = train, held_out
    return changed

  def evaluate_at_start(self, trainer: Trainer, state, records_changed: bool) -> None:
    summary = trainer.summary
    if "sft_end" in summary and not records_changed:  # same params and records as SFT's end: reuse its eval
      summary["rl_start"] = summary["sft_end"]
      summary["rl_start_samples"] = summary.get("sft_end_samples", [])
      trainer.metrics.write(self.name, 0, summary["rl_start"])
    elif trainer.config.eval.at_rl_start:
      trainer.evaluate(state.params, self.name, 0, tag="start")


def run_phases(trainer: Trainer) -> list[Phase]:
  """The phases with steps > 0, in order (SFT, then RL)."""
  names = [p for p in PHASE_KINDS if getattr(trainer.config, p).steps > 0]
  return [PHASE_KINDS[name].build(trainer, i) for i, name in enumerate(names)]
