"""The RL phase's rollout source: judged rounds of G rollouts per prompt, one per step.

    source = RolloutSource(batcher, sampler, reward, num_samples=G, micro_batches=M, schedule=schedule_for(rl))
    loader = source.attach(loader)                  # the phase's loader (refills and look-ahead draw from it)
    judged = source.round(state, batch, step)        # -> JudgedRound, for `RLLearner.update`

It owns the sampler or the paged engine, the reward (streaming judging hands each prompt's G captions to the judge
as soon as the engine has decoded them), and one schedule chosen from the config:
  OnPolicy       each step's batch rolled out from its own weights (default)
  RefillGroups   dynamic sampling: groups without signal replaced by groups of further batches (rl.filter_groups,
                 jaxcap.train.rollouts.refill)
  FullyAsync     asynchronous: the next k steps' rounds rolled out and judged while this step updates, on the
                 learner's devices or the rollouts' own (rl.max_staleness, rollout.devices;
                 jaxcap.train.rollouts.fully_async)
"""

from __future__ import annotations

import dataclasses
import functools
import time
from concurrent.futures import Future
from typing import Any, Protocol, Sequence

import jax
import numpy as np

from jaxcap.data.records import ImageRecord
from jaxcap.rewards.overlap import OverlappedReward
from jaxcap.sampling import Sampler
from jaxcap.train.rollouts.batching import Batcher
from jaxcap.train.rollouts.placement import onto
from jaxcap.train.rollouts.round import JudgedRound, Round
from jaxcap.train.steps.batches import HostBatch


class Schedule(Protocol):
  """How a source turns the loader's batch of a step into the round its update trains on."""

  def attach(self, loader): ...

  def round(self, source: "RolloutSource", state, batch: HostBatch, step: int, key: jax.Array) -> JudgedRound: ...


class OnPolicy:
  """Each step's batch rolled out from the weights it updates, and judged while its log-probs run."""

  def attach(self, loader):
    return loader

  def round(self, source, state, batch, step, key):
    t0 = time.perf_counter()
    rnd = source.rollout(state, batch, key, step)
    # until its lengths are on the host (the static sampler returns once its rollout is dispatched): the
    # generation, less the previous update's tail the learner subtracts (`JudgedRound.started`)
    rnd.rollouts.host_lengths
    metrics = {"time/rollout_s": time.perf_counter() - t0}

    def rewards():
      t1 = time.perf_counter()
      rnd.rewards = source.judge(rnd, step)
      metrics["time/judge_wait_s"] = time.perf_counter() - t1
      return rnd.rewards.values, rnd.rewards.valid

    return JudgedRound.of(rnd, rewards, metrics, started=t0)


@dataclasses.dataclass
class RolloutSource:
  """`round(state, batch, step) -> JudgedRound`: G rollouts per prompt of the step's batch (`batch`: the loader's,
  prepared by `prepare` on its thread), from the weights in `state`, judged by `reward`, as `schedule` says."""

  batcher: Batcher
  sampler: Sampler
  reward: OverlappedReward
  num_samples: int
  micro_batches: int
  schedule: Schedule = dataclasses.field(default_factory=OnPolicy)
  stream_judging: bool = False  # rl.stream_judging: groups judged as the paged engine finishes them

  def prepare(self, records: Sequence[ImageRecord]) -> HostBatch:
    return HostBatch(list(records), self.sampler.bucket(self.batcher.inputs(records)))

  def attach(self, loader):
    """Hands the source the phase's loader (restored, if resuming); returns the loader the loop draws from."""
    return self.schedule.attach(loader)

  def round(self, state, batch: HostBatch | Sequence[ImageRecord], step: int) -> JudgedRound:
    batch = batch if isinstance(batch, HostBatch) else self.prepare(batch)
    return self.schedule.round(self, state, batch, step, jax.random.fold_in(state.key, step))

  def rollout(self, state, batch: HostBatch, key: jax.Array, step: int) -> Round:
    """G rollouts per prompt of `batch` from `key` and the weights in `state`, in the update's layout on device (not
    judged yet; with streaming judging, its groups are being judged as step `step`'s: `Round.judging`)."""
    placed = self.sampler.place(batch.prompts)  # the step's one upload of prompts and pixels
    return self.lay_out(self.generate(state.params, batch, key, step, placed), placed)

  def generate(self, params, batch: HostBatch, key: jax.Array, step: int, placed=None) -> "Generated":
    """G rollouts per prompt of `batch` from `params`, on the ambient mesh (the rollout thread's, with
    rl.max_staleness), not laid out for the update; `placed`: its prompts already placed there (the static
    sampler then reuses them). With streaming judging its groups are judged as step `step`'s as they finish."""
    source = batch.prompts if self.sampler.wants_host_batch or placed is None else placed  # the paged engine's
    kw: dict[str, Any] = dict(num_samples=self.num_samples, params=params)
    stream = None
    if self.stream_judging and self.sampler.streams_groups:
      stream = self.reward.stream(batch.records, group_size=self.num_samples, step=step)
      kw["on_group"] = functools.partial(_hand_to_judge, stream, self.sampler.tokenizer)
    t0 = time.perf_counter()
    try:
      rollouts = self.sampler(source, key, **kw)
      if stream is not None and stream.added != len(batch.records):
        raise RuntimeError(f"the engine handed over {stream.added} of {len(batch.records)} groups")
    except BaseException:
      if stream is not None:  # its judging thread would wait for the missing groups
        stream.cancel()
      raise
    return Generated(batch, rollouts, None if stream is None else stream.future, time.perf_counter() - t0)

  def lay_out(self, gen: "Generated", placed) -> Round:
    """A generated round in the update's layout on the learner's mesh (`placed`: its prompts there); rollouts
    generated on other devices (rollout.devices) are copied over device to device first."""
    arrays = onto(gen.rollouts.arrays, self.batcher.mesh)
    arrays = self.batcher.rollout_batch(arrays, placed, self.num_samples, self.micro_batches, True)
    return Round(gen.batch, placed, gen.rollouts, *arrays, rewards=None, judging=gen.judging)

  def submit(self, rnd: Round, step: int) -> Future:
    """The future of a round's RewardBatch: its streamed judging, or its captions submitted now (waits for this
    process's tokens, to decode them; the judge runs on the reward's own thread, in submission order)."""
    if rnd.judging is not None:
      return rnd.judging
    return self.reward.submit(rnd.rollouts.text, rnd.batch.records, step=step)

  def settle(self) -> None:
    """After a judged round: e.g. the judge failure budget, agreed across processes."""
    self.reward.settle()

  def judge(self, rnd: Round, step: int):
    """The RewardBatch of a round's captions (waits for the judge)."""
    rewards = self.submit(rnd, step).result()
    self.settle()
    return rewards


@dataclasses.dataclass
class Generated:
  """A batch's rollouts as the sampler returned them (on the devices that generated them), the future of their
  streamed judging (None: judged after the rollout) and the rollout's wall seconds (dispatch to return: with the
  paged engine, the whole decode; the static sampler returns once dispatched)."""

  batch: HostBatch
  rollouts: Any
  judging: Future | None = None
  seconds: float = 0.0


def _hand_to_judge(stream, tokenizer, prompt: int, tokens: np.ndarray, lengths: np.ndarray) -> None:
  """The paged engine's `on_group`: prompt `prompt`'s G captions, decoded as `Rollouts.text` decodes them."""
  stream.add(prompt, tokenizer.batch_decode([t[:n] for t, n in zip(tokens, lengths)], skip_special_tokens=True))
