"""One-step off-policy RL (`rl.off_policy_steps` = 1): step t+1's rollouts are generated from step t's weights
while step t's judgments finish and its update runs, so a judge slower than the device no longer leaves the device
idle between rollout and update.

    schedule = OffPolicy(steps, checkpoint_every)   # the rollout source's schedule (jaxcap.train.rollouts.source)
    loader = schedule.attach(loader)                # a Lookahead: `peek()` draws the next step's batch early

A one-deep queue: each step trains on the round queued by the step before (rollouts of this step's batch from the
weights one update old, already being judged), and queues the next step's round. The update's ratio is taken
against the old log-probs recomputed with the current weights (or the sampler's, `rl.recompute_old_logprobs`
False); the sampler's log-probs are those of the behaviour policy, for the rollout correction
(`rl.rollout_correction`, TIS / MIS) and the `rollout_corr/*` mismatch metrics. `offpolicy/staleness` logs the
updates between the two (1 for a queued round, 0 for one rolled out at its own step).

No step queues a round across a checkpoint (nor past the phase's last step): the step after a checkpoint rolls out
its batch from its own weights, as a resumed run does, so a resumed run repeats the uninterrupted one and nothing
of the queue is saved. With several processes every one queues at the same steps (the rule reads only the config),
so their collectives stay in step.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import Future
from typing import Any, Callable

import jax

from jaxcap.train.rollouts.round import JudgedRound, Round


class Lookahead:
  """The phase's loader with one batch of look-ahead: `peek()` draws the next batch early, and the loop's next
  `next()` returns that same batch. `get_state()` is the position before a peeked batch not handed out yet."""

  def __init__(self, loader):
    self.loader = loader
    self._ahead: Any = None
    self._state: Any = None

  def __iter__(self):
    return self

  def __next__(self):
    if self._ahead is None:
      return next(self.loader)
    batch, self._ahead, self._state = self._ahead, None, None
    return batch

  def peek(self):
    if self._ahead is None:
      self._state = self.loader.get_state()
      self._ahead = next(self.loader)
    return self._ahead

  def get_state(self):
    return self.loader.get_state() if self._ahead is None else self._state

  def set_state(self, state) -> None:
    self._ahead = self._state = None
    self.loader.set_state(state)

  def close(self) -> None:
    getattr(self.loader, "close", lambda: None)()


def queues_after(step: int, steps: int, checkpoint_every: int) -> bool:
  """Whether 0-based step `step` of a phase of `steps` queues the next step's round: not when a checkpoint is
  saved after it (the loop saves after step s when (s + 1) % every == 0, and after the last step)."""
  done = step + 1
  return done < steps and not (checkpoint_every and done % checkpoint_every == 0)


@dataclasses.dataclass
class Queued:
  """A round rolled out ahead of its step: its rollouts and the future of its rewards; `staleness` counts the
  updates between the weights that generated it and the weights its step updates."""

  round: Round
  rewards: Future | None  # None until submitted to the judge
  staleness: int


@dataclasses.dataclass
class OffPolicy:
  """The rollout source's schedule with `rl.off_policy_steps` = 1, for a phase of `steps` steps checkpointed every
  `checkpoint_every`: each step trains on the round the step before queued (staleness 1), or on its own batch
  rolled out now (staleness 0: the phase's first step, the one after a checkpoint), and queues the next step's."""

  steps: int
  checkpoint_every: int
  peek: Callable[[], Any] | None = None  # the loader's next batch, drawn ahead (`Lookahead.peek`)
  queued: Queued | None = None

  def attach(self, loader):
    loader = Lookahead(loader)
    self.peek, self.queued = loader.peek, None  # a resumed or new phase starts with an empty queue
    return loader

  def round(self, source, state, batch, step: int, key: jax.Array) -> JudgedRound:
    current, self.queued = self.queued, None
    if current is not None and current.round.batch is not batch:
      raise RuntimeError("off-policy queue out of step with the loader: bind its Lookahead with RolloutSource.attach")
    if current is None:  # the phase's first step, or the one after a checkpoint: this batch from these weights
      current = Queued(source.rollout(state, batch, key, step), None, 0)
    ahead = None
    if self.peek is not None and queues_after(step, self.steps, self.checkpoint_every):
      # dispatched before anything of this step waits: the device samples the next batch from these weights first
      nxt = source.rollout(state, self.peek(), jax.random.fold_in(state.key, step + 1), step + 1)
      ahead = Queued(nxt, None, 1)
    rnd = current.round
    if current.rewards is None:
      current.rewards = source.submit(rnd, step)
    self.queued = ahead

    def rewards():  # called once this step's log-probs are dispatched: the next round is judged while they run
      if ahead is not None:
        ahead.rewards = source.submit(ahead.round, step + 1)
      rnd.rewards = current.rewards.result()
      source.settle()
      return rnd.rewards.values, rnd.rewards.valid

    return JudgedRound.of(rnd, rewards, {"offpolicy/staleness": float(current.staleness)})
