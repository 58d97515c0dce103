"""Dynamic sampling around one RL step (`rl.filter_groups`): groups whose valid rewards do not spread are dropped
after judging and their slots refilled with groups of further prompts drawn from the run's loader, until every
slot of the batch is filled or `rl.filter_groups_max_extra` extra prompts were drawn.

The batch keeps its shape: slot i of this process's B holds either the step's own group i (kept), or the n-th
kept group of the later rounds (the n-th dropped slot, in order), or -- when the budget ran out -- its own dropped
group with every reward masked, so it carries no gradient and enters no statistic. With no group dropped the batch
is exactly the step's first one.

Every process draws the same number of rounds (the loader's position moves in step everywhere, and a resumed run
draws the same batches): after each round one small host all-gather of (open slots, dropped, kept) decides, so
all processes agree on when the step is complete.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxcap import multihost
from jaxcap.rl.group_filter import kept_groups
from jaxcap.train.rollouts.round import JudgedRound, Round


class SlotFill:
  """Which group fills each of `size` slots: `source[i]` = (round, group index in that round), `filled[i]` whether
  that group is a kept one (else slot i holds round 0's dropped group i, to be masked)."""

  def __init__(self, size: int):
    self.source = [(0, i) for i in range(size)]
    self.filled = np.zeros(size, bool)
    self.rounds = 0
    self.moved_anywhere = False  # some process's slots hold groups of later rounds (set by GroupFilter.fill)

  @property
  def open(self) -> int:
    return int((~self.filled).sum())

  def add(self, keep: np.ndarray) -> int:
    """Takes the next round's kept groups (bool [B]) into the open slots, in order; returns how many it placed."""
    keep = np.asarray(keep, bool)
    r, self.rounds = self.rounds, self.rounds + 1
    if r == 0:
      self.filled = keep.copy()
      return int(keep.sum())
    slots = np.flatnonzero(~self.filled)
    groups = np.flatnonzero(keep)[: len(slots)]
    for slot, group in zip(slots, groups):
      self.source[slot] = (r, int(group))
      self.filled[slot] = True
    return len(groups)

  @property
  def same_rows(self) -> bool:
    """Every slot holds the first round's own group (kept or masked): no rows move."""
    return all(s == (0, i) for i, s in enumerate(self.source))


@dataclasses.dataclass(frozen=True)
class GroupFilter:
  """`fill(first, more)`: `first` is the step's judged Round, `more(r)` draws and judges round r >= 1; returns
  (SlotFill, the rounds, the filter/* metrics, summed over processes). Its `moved_anywhere` is agreed by every
  process: the batch is then assembled everywhere (the re-placed prompts and the gather are collectives)."""

  mode: str
  num_samples: int
  max_rounds: int  # 1 + the budget of extra batches

  @classmethod
  def from_config(cls, rl) -> "GroupFilter":
    return cls(str(rl.filter_groups), int(rl.num_samples), 1 + int(rl.filter_groups_max_extra) // int(rl.batch_size))

  def keep(self, rewards) -> np.ndarray:
    return kept_groups(rewards.values, rewards.valid, rewards.weights, rewards.names, self.num_samples, self.mode)

  def fill(self, first: Round, more: Callable[[int], Round]) -> tuple[SlotFill, list[Round], dict[str, float]]:
    rounds = [first]
    keep = self.keep(first.rewards)
    fill = SlotFill(len(keep))
    dropped = kept = generated = 0
    first_dropped = None
    while True:
      fill.add(keep)
      local = [fill.open, int((~keep).sum()), int(keep.sum()), len(keep), int(not fill.same_rows)]
      open_slots, d, k, n, moved = (int(x) for x in np.sum(multihost.allgather_ints(local), axis=0))
      fill.moved_anywhere = moved > 0
      dropped, kept, generated = dropped + d, kept + k, generated + n
      first_dropped = d / n if first_dropped is None else first_dropped
      if open_slots == 0 or len(rounds) >= self.max_rounds:
        break
      rounds.append(more(len(rounds)))
      keep = self.keep(rounds[-1].rewards)
    metrics = {
      "filter/dropped": float(dropped),
      "filter/generated": float(generated),
      "filter/kept_frac": kept / generated if generated else float("nan"),
      "filter/first_dropped_frac": float(first_dropped),
      "filter/rounds": float(len(rounds)),
      "filter/unfilled": float(open_slots),
    }
    return fill, rounds, metrics


def assembled_rewards(fill: SlotFill, rounds: Sequence[Round], num_samples: int) -> tuple[np.ndarray, np.ndarray]:
  """(values float32 [B*G, R], valid bool [B*G, R]) of the filled batch; an unfilled slot's rewards all masked."""
  g = num_samples
  values, valid = [], []
  for (r, i), filled in zip(fill.source, fill.filled):
    rewards = rounds[r].rewards
    values.append(rewards.values[i * g : (i + 1) * g])
    valid.append(rewards.valid[i * g : (i + 1) * g] & filled)
  return np.concatenate(values).astype(np.float32), np.concatenate(valid)


def gather_index(fill: SlotFill, rows: int, num_samples: int, num_micro: int) -> np.ndarray:
  """int32 [B*G]: for each of this process's filled rows (slot-major), its row in the rounds' update-layout arrays
  stacked and flattened ([R, M, P*b*G] -> [R*M*P*b*G]; micro-batch m holds every process's rows m*b..(m+1)*b-1,
  process by process: `jaxcap.train.rollouts.batching.micro_major`)."""
  g, mb = num_samples, rows // num_micro
  procs, p = jax.process_count(), jax.process_index()
  per_micro = procs * mb * g
  index = np.empty((rows, g), np.int64)
  for slot, (r, i) in enumerate(fill.source):
    m, w = divmod(i, mb)
    index[slot] = r * num_micro * per_micro + m * per_micro + p * mb * g + w * g + np.arange(g)
  return index.reshape(-1).astype(np.int32)


def gather_rows(arrays: Sequence[jax.Array | None], index: jax.Array) -> jax.Array | None:
  """The rows `index` [M, P*b*G] picks from the rounds' arrays [M, P*b*G, N] stacked (None when they are None)."""
  if arrays[0] is None:
    return None
  return _gather_fn(arrays[0].sharding)(tuple(arrays), index)


@functools.lru_cache(maxsize=8)
def _gather_fn(sharding):
  def fn(arrays, index):
    stacked = jnp.stack(arrays)
    return stacked.reshape(-1, stacked.shape[-1])[index]

  return jax.jit(fn, out_shardings=sharding)


class NothingKeptError(RuntimeError):
  """Dynamic sampling kept no group for `train.collapse_steps` RL steps in a row."""


def _kept_nothing_message(mode: str, g: int, rounds: int, steps: int) -> str:
  what = "no valid reward spread" if mode == "spread" else f"no spread in {mode!r}"
  return (
    f"rl.filter_groups={mode!r} kept no group ({what} among the G={g} samples of any prompt, {rounds} round(s) "
    f"drawn) for {steps} step(s) in a row: those steps train on nothing"
  )


@dataclasses.dataclass
class RefillGroups:
  """The rollout source's schedule under dynamic sampling (`rl.filter_groups`): judged rounds until every slot holds
  a kept group or the budget is spent (round r >= 1 draws the loader's next batch and samples from fold_in(key,
  r)); the round the update trains on is the assembled batch."""

  group_filter: GroupFilter
  draw: Callable[[], Any] | None = None  # the loader's next batch, bound by `attach`
  # steps in a row that kept no group before the run stops (train.collapse_steps; 0 = never): such a step trains
  # on nothing, and a reward with no spread in any group will not start spreading by itself
  patience: int = 0
  empty_steps: int = dataclasses.field(default=0, compare=False)

  def attach(self, loader):
    self.draw = lambda: next(loader)  # refills move the loader's saved position with them
    return loader

  def round(self, source, state, batch, step: int, key: jax.Array) -> JudgedRound:
    g, m = source.num_samples, source.micro_batches

    def judged(r: int, host_batch) -> Round:
      rnd = source.rollout(state, host_batch, key if r == 0 else jax.random.fold_in(key, r), step)
      rnd.rewards = source.judge(rnd, step)
      return rnd

    def more(r: int) -> Round:
      if self.draw is None:
        raise RuntimeError("rl.filter_groups_max_extra > 0 needs the loader: bind it with RolloutSource.attach")
      return judged(r, self.draw())

    fill, rounds, filter_metrics = self.group_filter.fill(judged(0, batch), more)
    self.check_kept(filter_metrics, step)
    first = rounds[0]
    rewards = assembled_rewards(fill, rounds, g)
    if not fill.moved_anywhere:
      return JudgedRound.of(first, lambda: rewards, filter_metrics)
    # the filled batch's prompts processed and placed again; its rollouts gathered from the rounds on device
    assembled = source.prepare([rounds[r].batch.records[i] for r, i in fill.source])
    placed = source.sampler.place(assembled.prompts)
    index = source.batcher.micro(gather_index(fill, len(fill.source), g, m), m)
    arrays = tuple(gather_rows([getattr(x, f) for x in rounds], index) for f in ("tokens", "cmask", "behaviour"))
    lengths = np.concatenate([rounds[r].rollouts.host_lengths[i * g : (i + 1) * g] for r, i in fill.source])
    return JudgedRound(assembled, placed, lengths, *arrays, lambda: rewards, first, filter_metrics)

  def check_kept(self, metrics: dict[str, float], step: int) -> None:
    """Counts a step whose filter kept no group (every process agrees: the counts are summed); warns, and after
    `patience` such steps in a row stops the run naming the filter and the fixes."""
    if metrics["filter/generated"] and metrics["filter/generated"] > metrics["filter/dropped"]:
      self.empty_steps = 0
      return
    self.empty_steps += 1
    f = self.group_filter
    message = _kept_nothing_message(f.mode, f.num_samples, int(metrics["filter/rounds"]), self.empty_steps)
    if self.patience and self.empty_steps >= self.patience:
      raise NothingKeptError(
        f"{message}; stopping at RL step {step} (train.collapse_steps={self.patience}). Check that the rewards vary "
        "within a group (reward/* in metrics.jsonl, the rollout records), raise rl.num_samples or "
        "sampling.temperature, or set rl.filter_groups=off"
      )
    print(f"warning: RL step {step}: {message}", flush=True)
