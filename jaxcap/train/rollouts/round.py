"""What the rollout source hands the learner: a round of G rollouts per prompt, and the judged round an update
trains on."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import numpy as np


@dataclasses.dataclass
class Round:
  """One batch of prompts rolled out: its host batch (records, prompts), the placed prompts, the rollouts, the update
  layout's tokens / completion mask / sampler log-probs [M, P*b*G, N] and the rewards (this process's B*G rows)."""

  batch: Any  # HostBatch
  placed: Any
  rollouts: Any
  tokens: jax.Array
  cmask: jax.Array
  behaviour: jax.Array | None
  rewards: Any = None  # RewardBatch, once judged
  judging: Any = None  # Future[RewardBatch] of its streamed judging (rl.stream_judging), opened by the rollout


@dataclasses.dataclass
class JudgedRound:
  """The batch one RL update trains on: `batch` (HostBatch) and `placed` its prompts, `lengths` [B*G] its
  completions' lengths on the host, `tokens` / `cmask` / `behaviour` [M, P*b*G, N] its rollouts in the update's
  layout on device. `rewards()` waits for the judge and returns (values float32 [B*G, R], valid bool [B*G, R]);
  the learner calls it only after it has dispatched the round's log-prob passes, so they run while the judge
  judges. `first` is the round of the loader's own batch (its rewards, once judged, are the step's reward metrics
  and rollout records); `metrics` the source's own (filter/*, async/*, time/rollout_s, time/judge_wait_s)."""

  batch: Any
  placed: Any
  lengths: np.ndarray
  tokens: jax.Array
  cmask: jax.Array
  behaviour: jax.Array | None
  rewards: Callable[[], tuple[np.ndarray, np.ndarray]]
  first: Round
  metrics: dict = dataclasses.field(default_factory=dict)
  started: float | None = None  # perf_counter when a round rolled out for this step began (None: rolled out ahead)

  @classmethod
  def of(cls, rnd: Round, rewards: Callable, metrics: dict | None = None, started: float | None = None):
    """A round trained on as it was rolled out (no refill)."""
    return cls(
      rnd.batch, rnd.placed, rnd.rollouts.host_lengths, rnd.tokens, rnd.cmask, rnd.behaviour, rewards, rnd,
      metrics or {}, started,
    )  # fmt: skip
