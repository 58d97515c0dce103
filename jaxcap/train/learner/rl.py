"""The RL learner: `update(step_fn, state, round) -> (state, metrics)` from a judged round of the rollout source
(jaxcap.train.rollouts.source), around the pure, jitted steps in jaxcap.train.steps.updates.

From the round's rollouts (tokens, masks and the sampler's log-probs, which never leave the device) it derives the
update's inputs (padded micro-batches, or packed rows where packing pays), dispatches the old / reference log-prob
passes, and only then waits for the round's rewards, so the passes run while the judge judges; then `rl_step`.
The metrics come back as `PendingMetrics` (device values still in flight), so the loop fetches them after it has
dispatched the next step instead of waiting for this one to finish.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxcap.data.records import ImageRecord
from jaxcap.host_memory import release_freed
from jaxcap.models import lora
from jaxcap.rl.rollout_correction import mismatch_metrics
from jaxcap.train.logs.metrics import DeviceTimer, PendingMetrics
from jaxcap.train.logs.reward_metrics import reward_metrics
from jaxcap.train.packing.batch import packed_rows, packing_metrics, with_pixels
from jaxcap.train.rollouts.batching import Batcher
from jaxcap.train.rollouts.round import JudgedRound
from jaxcap.train.rollouts.source import RolloutSource
from jaxcap.train.steps.batches import HostBatch
from jaxcap.train.steps.updates import RolloutBatch


@dataclasses.dataclass
class RLLearner:
  """`update(step_fn, state, judged, step) -> (state, PendingMetrics)` with `step_fn = jit(rl_step)` and
  `logprob_fn = jit(sequence_logprobs)`. With `micro_batch_tokens` > 0 both are the packed programs (`RunPrograms`
  builds the pair): they take the round's `PackedInputs` where the padded ones take the micro-batches' vision
  layouts, and a round whose packing saves less than `packing_min_saving` of its padded pass's decoder FLOPs runs
  the padded programs (`packing_pays`); metrics `packing/packed`, `packing/saving`, `packing/padding_share` (of the
  layout that ran), `packing/micro_batches`."""

  batcher: Batcher
  logprob_fn: Callable
  num_samples: int
  micro_batches: int
  recompute_old_logprobs: bool
  rollout_correction: bool = False  # rl_step corrects: hand it the sampler's log-probs (rl.rollout_correction)
  stop_ids: tuple[int, ...] | None = None  # with rl.mask_truncated: the stop tokens, to flag truncated captions
  micro_batch_tokens: int = 0  # rl.micro_batch_tokens: > 0 packs the log-prob passes and the update (packed_batch)
  packing_min_saving: float = 0.1  # rl.packing_min_saving: packed only if that saves this share of FLOPs
  recorder: Any = None  # jaxcap.train.logs.rollout_records.RolloutRecorder: rollout records at its steps
  reference_is_base: bool = False  # LoRA with a KL term: reference log-probs from the params with adapters off
  last_update: DeviceTimer | None = dataclasses.field(default=None, init=False, repr=False)

  def update(self, step_fn: Callable, state, judged: JudgedRound, step: int):
    """One update on `judged` (0-based `step`); the reward metrics and rollout records are its first round's. Its
    record's time/update_s and time/logprobs_s are this update's and its log-prob passes' device time
    (`DeviceTimer`), and time/rollout_s of a round rolled out just now (on-policy) leaves out the time the device
    was still running the update before it."""
    self._without_the_last_update(judged)
    prompts, layout, packing = self.inputs(judged.batch, judged.placed, judged.lengths, judged.tokens)
    dispatched = time.perf_counter()
    logprobs = self.logprobs(state, prompts, layout, judged.tokens, judged.cmask, judged.behaviour)
    passes = DeviceTimer(dispatched, logprobs[:2])  # old / reference log-probs: 0 s when there is no pass to run
    values, valid = judged.rewards()  # waits for the judge, while the log-prob passes run
    # on CPU, the retained heap's free pages back (the rollouts' and log-prob passes' buffers, and the last update's
    # block they were cut from), so this update's temporaries do not stack on theirs (jaxcap.host_memory)
    release_freed(wait_for=logprobs)
    rollout = (judged.tokens, judged.cmask, judged.behaviour, values, valid)
    extra = {**packing, **judged.metrics}
    state, metrics = self._update(step_fn, state, prompts, layout, rollout, logprobs, judged, extra, step)
    metrics.timers = {"time/logprobs_s": passes, **metrics.timers}
    return state, metrics

  def _without_the_last_update(self, judged: JudgedRound) -> None:
    """time/rollout_s less its overlap with the previous update: an on-policy rollout (`judged.started` set)
    samples from that update's weights, so its programs start only once it is done."""
    seconds, started, last = judged.metrics.get("time/rollout_s"), judged.started, self.last_update
    if seconds is None or started is None or last is None:
      return
    judged.metrics["time/rollout_s"] = seconds - min(seconds, max(0.0, last.done_at() - started))

  def inputs(self, batch: HostBatch, placed, lengths: np.ndarray, tokens: jax.Array):
    """The update's (prompts, layout, packing/* metrics) of the batch the update sees: `placed` its prompts on
    device, `lengths` [B*G] its completions' lengths on the host, `tokens` [M, b*G, C] its completions. Padded:
    the micro-batches' vision layouts; packed (micro_batch_tokens > 0): the step's `PackedInputs`, or the padded
    layout for a step whose packing does not pay (`packing_pays`: the programs dispatch on the layout)."""
    if self.micro_batch_tokens <= 0:
      return (*self.batcher.prompt_batch(placed, self.micro_batches), {})
    b = self.batcher
    c_len, budget = tokens.shape[-1], self.micro_batch_tokens
    rows = packed_rows(batch.prompts, lengths, c_len, budget, b.processor.cfg, b.bucket_steps)
    metrics, packed = packing_metrics(
      rows, batch.prompts, lengths, c_len, self.micro_batches, budget, self.packing_min_saving, b.processor.cfg
    )
    prompts, layout = b.prompt_batch(placed, self.micro_batches, vision=not packed)
    return prompts, with_pixels(placed, rows) if packed else layout, metrics

  def logprobs(self, state, prompts, layout, tokens, cmask, behaviour):
    """(old log-probs, reference log-probs or None, mismatch metrics) of the batch, dispatched on device."""
    recompute = self.recompute_old_logprobs
    old = self.logprob_fn(state.params, prompts, layout, tokens) if recompute else behaviour
    # the sampler's log-probs vs the training program's, a program of its own so the update's is unchanged; with
    # the sampler's as old log-probs there is nothing to compare (SAMPLER_OLD_MISMATCH)
    mismatch = _mismatch_fn(old, behaviour, cmask) if recompute else {}
    ref = None
    if state.ref_params is not None:
      ref = self.logprob_fn(state.ref_params, prompts, layout, tokens)
    elif self.reference_is_base:  # the frozen base itself: B = 0 in every adapter, no second copy of the model
      ref = self.logprob_fn(lora.adapters_off(state.params), prompts, layout, tokens)
    return old, ref, mismatch

  def _update(self, step_fn, state, prompts, layout, rollout, logprobs, judged: JudgedRound, extra: dict, step: int):
    """The update from (tokens, mask, sampler log-probs, reward values [B*G, R], valid [B*G, R]); the reward
    metrics (and the rollout records of 0-based `step`) are the first round's (the loader's batch, as without a
    filter) plus `extra`."""
    g, m = self.num_samples, self.micro_batches
    (tokens, cmask, behaviour, values, valid), (old, ref, mismatch) = rollout, logprobs
    first = judged.first
    rewards = first.rewards
    if self.recorder is not None and self.recorder.wants(step + 1):  # numbered as metrics.jsonl numbers the step
      ro = first.rollouts
      self.recorder(step + 1, first.batch.records, ro.text, rewards, ro.tokens, ro.host_lengths)
    r = len(rewards.names)
    rollout_batch = RolloutBatch(
      tokens,
      cmask,
      old,
      self.batcher.micro(values.reshape(-1, g, r).astype(np.float32), m),
      self.batcher.micro(valid.reshape(-1, g, r), m),
      jnp.asarray(rewards.weights, jnp.float32),
      ref,
      behaviour if self.rollout_correction else None,
      None if self.stop_ids is None else _truncated_fn(tokens, cmask, jnp.asarray(self.stop_ids, jnp.int32)),
    )
    dispatched = time.perf_counter()
    state, metrics = step_fn(state, prompts, rollout_batch, layout)
    # its device time, from a thread: the loop goes on to dispatch the next step (whose rollout waits for it anyway)
    self.last_update = timer = DeviceTimer(dispatched, metrics, inputs=(old, ref))
    metrics = {**metrics, **{f"rollout_corr/{k}": v for k, v in mismatch.items()}}
    host = {} if self.recompute_old_logprobs else {f"rollout_corr/{k}": v for k, v in SAMPLER_OLD_MISMATCH.items()}
    host.update(reward_metrics(rewards, group_size=g))
    host.update({"length/mean": float(first.rollouts.host_lengths.mean()), **rewards.extras, **extra})
    return state, PendingMetrics(metrics, host, {"time/update_s": timer})


@dataclasses.dataclass
class RLUpdate:
  """The RL phase's step: the source's judged round of the loader's batch, then the learner's update on it.
  `prepare` runs on the loader's thread (images decoded and processed, prompts bucketed: numpy only)."""

  source: RolloutSource
  learner: RLLearner

  def prepare(self, records: Sequence[ImageRecord]) -> HostBatch:
    return self.source.prepare(records)

  def __call__(self, step_fn: Callable, state, batch, step: int):
    return self.learner.update(step_fn, state, self.source.round(state, batch, step), step)


# The mismatch metrics when the old log-probs are the sampler's own (rl.recompute_old_logprobs=False): the
# divergences are exactly 0, so no program computes them; the two log-perplexities are not measured (null in
# metrics.jsonl). Every step still logs every rollout_corr/* key, as with recomputed old log-probs.
SAMPLER_OLD_MISMATCH = dict.fromkeys(("kl_k1", "kl_k3", "log_ppl_diff", "log_ppl_abs_diff", "chi2_token"), 0.0) | {
  "training_log_ppl": float("nan"),
  "rollout_log_ppl": float("nan"),
}


@jax.jit
def _mismatch_fn(old, behaviour, mask):
  flat = lambda x: x.reshape(-1, x.shape[-1])
  return mismatch_metrics(flat(old), flat(behaviour), flat(mask))


@jax.jit
def _truncated_fn(tokens, mask, stop_ids):
  """bool [M, b*G]: no stop token among the caption's tokens (it hit max_new_tokens)."""
  return ~jnp.any(mask & jnp.isin(tokens, stop_ids), axis=-1)
