"""One update of each phase from a list of records: host batching around the pure, jitted steps in step.py.

SFT: records -> prompts + target captions -> `sft_step`. RL: records -> G rollouts per prompt (sampler) ->
rewards on host threads while the device computes the old / reference log-probs -> `rl_step`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxcap.data.records import ImageRecord
from jaxcap.rewards.overlap import OverlappedReward
from jaxcap.sampling import Sampler
from jaxcap.train.batching import Batcher, encode_targets
from jaxcap.train.metrics import to_scalars
from jaxcap.train.sft_targets import SFTTarget
from jaxcap.train.step import RolloutBatch


@dataclasses.dataclass
class SFTUpdate:
  """`update(step_fn, state, records, rng) -> (state, metrics)` with `step_fn = jit(sft_step)`."""

  batcher: Batcher
  targets: SFTTarget
  tokenizer: Any
  eos_id: int
  micro_batches: int
  max_target_tokens: int

  def __call__(self, step_fn: Callable, state, records: Sequence[ImageRecord], rng: np.random.Generator):
    m = self.micro_batches
    prompts, layout = self.batcher.prompts(self.batcher.inputs(records), m)
    captions = [self.targets(r, rng) for r in records]
    ids, mask = encode_targets(self.tokenizer, captions, self.max_target_tokens, self.eos_id)
    state, metrics = step_fn(state, prompts, self.batcher.micro(ids, m), self.batcher.micro(mask, m), layout)
    return state, to_scalars(metrics)


@dataclasses.dataclass
class RLUpdate:
  """`update(step_fn, state, records, step) -> (state, metrics)` with `step_fn = jit(rl_step)`; rewards come from
  `reward` on its own host thread, log-probs from `logprob_fn = jit(sequence_logprobs)`."""

  batcher: Batcher
  sampler: Sampler
  reward: OverlappedReward
  logprob_fn: Callable
  num_samples: int
  micro_batches: int
  recompute_old_logprobs: bool

  def __call__(self, step_fn: Callable, state, records: Sequence[ImageRecord], step: int):
    g, m = self.num_samples, self.micro_batches
    inputs = self.batcher.inputs(records)
    rollouts = self.sampler(inputs, jax.random.fold_in(state.key, step), num_samples=g, params=state.params)
    # The judge runs on a host thread while the device computes the old / reference log-probs (async dispatch).
    future = self.reward.submit(rollouts.text, records, step=step)
    prompts, layout = self.batcher.prompts(inputs, m)
    tokens = self.batcher.micro(rollouts.tokens, m)
    cmask = self.batcher.micro(rollouts.completion_mask, m)
    if self.recompute_old_logprobs:
      old = self.logprob_fn(state.params, prompts, layout, tokens)
    else:
      old = self.batcher.micro(rollouts.policy_logprobs, m)
    ref = self.logprob_fn(state.ref_params, prompts, layout, tokens) if state.ref_params is not None else None
    rewards = future.result()
    r = len(rewards.names)
    values = self.batcher.micro(rewards.values.reshape(-1, g, r).astype(np.float32), m)
    valid = self.batcher.micro(rewards.valid.reshape(-1, g, r), m)
    batch = RolloutBatch(tokens, cmask, old, values, valid, jnp.asarray(rewards.weights, jnp.float32), ref)
    state, metrics = step_fn(state, prompts, batch, layout)
    out = to_scalars(metrics)
    out.update(reward_metrics(rewards))
    out.update({"length/mean": float(np.asarray(rollouts.lengths).mean()), **rewards.extras})
    return state, out


def reward_metrics(rewards) -> dict[str, float]:
  """reward/mean (the weighted reward, each dimension averaged over its valid entries), reward/<name> (NaN when
  no judgment of it was valid), length/words and judge/failed."""
  values, valid = rewards.values, rewards.valid
  out = {
    "reward/mean": weighted_mean(values, valid, rewards.weights),
    "length/words": float(rewards.caption_lengths.mean()),
    "judge/failed": float(sum(rewards.failed_judgments.values())),
  }
  for k, name in enumerate(rewards.names):
    out[f"reward/{name}"] = float(values[valid[:, k], k].mean()) if valid[:, k].any() else float("nan")
  return out


def weighted_mean(values: np.ndarray, valid: np.ndarray, weights: np.ndarray) -> float:
  """Mean over captions of the weighted reward, each dimension averaged over its valid entries only."""
  means = np.array([values[valid[:, k], k].mean() if valid[:, k].any() else 0.0 for k in range(values.shape[1])])
  return float(means @ np.asarray(weights))
