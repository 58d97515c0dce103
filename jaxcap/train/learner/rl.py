"""RL's update: host batching around the pure, jitted steps in step.py (SFT's: `jaxcap.train.learner.sft`).

Each update has a `prepare(records)` that runs on the loader's thread ahead of its step (images decoded and
processed, prompts padded: numpy only) and a `__call__` that runs the step from that host batch. RL: the step's
prompts uploaded once -> G rollouts per prompt (sampler) ->
old / reference log-probs on device while the captions are judged on a host thread -> `rl_step`; the rollouts'
tokens, masks and log-probs never leave the device (only this process's rows' tokens and lengths are copied to
the host, to decode the captions).

Both return the step's metrics as `PendingMetrics` (device values still in flight), so the loop fetches them
after it has dispatched the next step instead of waiting for this one to finish.
"""

from __future__ import annotations

import dataclasses
import functools
from concurrent.futures import Future
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxcap.data.records import ImageRecord
from jaxcap.models import lora
from jaxcap.rewards.overlap import OverlappedReward
from jaxcap.rl.rollout_correction import mismatch_metrics
from jaxcap.sampling import Sampler
from jaxcap.train.steps.batches import HostBatch
from jaxcap.train.rollouts.batching import Batcher
from jaxcap.train.logs.metrics import PendingMetrics
from jaxcap.train.rollouts.refill import GroupFilter, Round, filtered_step
from jaxcap.train.logs.reward_metrics import reward_metrics
from jaxcap.train.rollouts.off_policy import off_policy_step
from jaxcap.train.packing.batch import packed_rows, packing_metrics, with_pixels
from jaxcap.train.steps.updates import RolloutBatch


@dataclasses.dataclass
class RLUpdate:
  """`update(step_fn, state, batch, step) -> (state, PendingMetrics)` with `step_fn = jit(rl_step)`; rewards come
  from `reward` on its own host thread, log-probs from `logprob_fn = jit(sequence_logprobs)`. With
  `micro_batch_tokens` > 0 both are the packed programs (`RunPrograms` builds the pair), and they take the step's
  `PackedInputs` where the padded ones take the micro-batches' vision layouts, and a step whose packing saves less
  than `packing_min_saving` of its padded pass's decoder FLOPs runs the padded programs (`packing_pays`); metrics
  `packing/packed`, `packing/saving`, `packing/padding_share` (of the layout that ran), `packing/micro_batches`.

  With `group_filter` (rl.filter_groups) the judged groups that carry no signal are replaced by groups of further
  batches from `draw` (the phase's loader, bound by `RLPhase.attach`) before the update (jaxcap.train.rollouts.refill); the
  packed inputs are then those of the assembled batch. With `off_policy_steps` = 1 each step trains on rollouts
  generated from the weights before the last update (jaxcap.train.rollouts.off_policy). With `stream_judging` and a
  sampler that hands over finished groups (the paged engine), each prompt's G captions go to the judge as soon as
  they are decoded (jaxcap.rewards.streaming), and the rewards equal those of judging the whole batch after the
  rollout; the static sampler finishes every group at once, so there it judges the batch after the rollout, as
  without streaming."""

  batcher: Batcher
  sampler: Sampler
  reward: OverlappedReward
  logprob_fn: Callable
  num_samples: int
  micro_batches: int
  recompute_old_logprobs: bool
  rollout_correction: bool = False  # rl_step corrects: hand it the sampler's log-probs (rl.rollout_correction)
  stop_ids: tuple[int, ...] | None = None  # with rl.mask_truncated: the stop tokens, to flag truncated captions
  micro_batch_tokens: int = 0  # rl.micro_batch_tokens: > 0 packs the log-prob passes and the update (packed_batch)
  packing_min_saving: float = 0.1  # rl.packing_min_saving: packed only if that saves this share of FLOPs
  group_filter: GroupFilter | None = None
  draw: Callable[[], HostBatch] | None = None  # the next batch of the run's loader, for refills
  off_policy_steps: int = 0  # rl.off_policy_steps: 1 = each step trains on rollouts queued by the step before
  peek: Callable[[], HostBatch] | None = None  # off-policy: the loader's next batch, drawn ahead (Lookahead.peek)
  queues: Callable[[int], bool] | None = None  # off-policy: whether a step queues the next one's round
  queued: Any = None  # off-policy: the round queued for the next step (off_policy.Queued)
  recorder: Any = None  # jaxcap.train.logs.rollout_records.RolloutRecorder: rollout records at its steps
  reference_is_base: bool = False  # LoRA with a KL term: reference log-probs from the params with adapters off
  stream_judging: bool = False  # rl.stream_judging: groups judged as the paged engine finishes them

  def prepare(self, records: Sequence[ImageRecord]) -> HostBatch:
    return HostBatch(list(records), self.sampler.bucket(self.batcher.inputs(records)))

  def __call__(self, step_fn: Callable, state, batch: HostBatch | Sequence[ImageRecord], step: int):
    batch = batch if isinstance(batch, HostBatch) else self.prepare(batch)
    key = jax.random.fold_in(state.key, step)
    if self.off_policy_steps:
      return off_policy_step(self, step_fn, state, batch, step, key)
    if self.group_filter is not None:
      return filtered_step(self, step_fn, state, batch, step, key)
    first = self.rollout(state, batch, key, step)
    # Everything the update needs from the rollouts is derived on device, and dispatched before the host waits
    # for the captions: the old / reference log-probs run while this thread decodes and the judge judges.
    # (Packed, the rows are cut by the completions' lengths: that waits for the rollout, as decoding does.)
    prompts, layout, packing = self.inputs(batch, first.placed, first.rollouts.host_lengths, first.tokens)
    logprobs = self.logprobs(state, prompts, layout, first.tokens, first.cmask, first.behaviour)
    first.rewards = self.judge(first, step)
    rollout = (first.tokens, first.cmask, first.behaviour, first.rewards.values, first.rewards.valid)
    return self._update(step_fn, state, prompts, layout, rollout, logprobs, first, packing, step)

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

  def rollout(self, state, batch: HostBatch, key: jax.Array, step: int) -> Round:
    """G rollouts per prompt of `batch` from `key`, in the update's layout on device (not judged yet; with
    streaming judging, its groups are being judged as step `step`'s: `Round.judging`)."""
    placed = self.sampler.place(batch.prompts)  # the step's one upload of prompts and pixels
    source = batch.prompts if getattr(self.sampler, "wants_host_batch", False) else placed  # the paged engine's
    kw = dict(num_samples=self.num_samples, params=state.params)
    stream = None
    if self.stream_judging and getattr(self.sampler, "streams_groups", False):
      stream = self.reward.stream(batch.records, group_size=self.num_samples, step=step)
      kw["on_group"] = functools.partial(_hand_to_judge, stream, self.sampler.tokenizer)
    try:
      rollouts = self.sampler(source, key, **kw)
      if stream is not None and stream.added != len(batch.records):
        raise RuntimeError(f"the engine handed over {stream.added} of {len(batch.records)} groups")
    except BaseException:
      if stream is not None:  # its judging thread would wait for the missing groups
        stream.cancel()
      raise
    arrays = self.batcher.rollout_batch(rollouts.arrays, placed, self.num_samples, self.micro_batches, True)
    return Round(batch, placed, rollouts, *arrays, rewards=None, judging=None if stream is None else stream.future)

  def submit(self, rollout: Round, step: int) -> Future:
    """The future of a round's RewardBatch: its streamed judging, or its captions submitted now (waits for this
    process's tokens, to decode them)."""
    if rollout.judging is not None:
      return rollout.judging
    return self.reward.submit(rollout.rollouts.text, rollout.batch.records, step=step)

  def judge(self, rollout: Round, step: int):
    """The RewardBatch of a round's captions (waits for the judge)."""
    rewards = self.submit(rollout, step).result()
    self.reward.settle()  # e.g. the judge failure budget, agreed across processes
    return rewards

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

  def _update(self, step_fn, state, prompts, layout, rollout, logprobs, first: Round, extra: dict, step: int):
    """The update from (tokens, mask, sampler log-probs, reward values [B*G, R], valid [B*G, R]); the reward
    metrics (and the rollout records of 0-based `step`) are the first round's (the loader's batch, as without a
    filter) plus `extra`."""
    g, m = self.num_samples, self.micro_batches
    (tokens, cmask, behaviour, values, valid), (old, ref, mismatch) = rollout, logprobs
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
    state, metrics = step_fn(state, prompts, rollout_batch, layout)
    metrics = {**metrics, **{f"rollout_corr/{k}": v for k, v in mismatch.items()}}
    host = {} if self.recompute_old_logprobs else {f"rollout_corr/{k}": v for k, v in SAMPLER_OLD_MISMATCH.items()}
    host.update(reward_metrics(rewards, group_size=g))
    host.update({"length/mean": float(first.rollouts.host_lengths.mean()), **rewards.extras, **extra})
    return state, PendingMetrics(metrics, host)


# The mismatch metrics when the old log-probs are the sampler's own (rl.recompute_old_logprobs=False): the
# divergences are exactly 0, so no program computes them; the two log-perplexities are not measured (null in
# metrics.jsonl). Every step still logs every rollout_corr/* key, as with recomputed old log-probs.
SAMPLER_OLD_MISMATCH = dict.fromkeys(("kl_k1", "kl_k3", "log_ppl_diff", "log_ppl_abs_diff", "chi2_token"), 0.0) | {
  "training_log_ppl": float("nan"),
  "rollout_log_ppl": float("nan"),
}


def _hand_to_judge(stream, tokenizer, prompt: int, tokens: np.ndarray, lengths: np.ndarray) -> None:
  """The paged engine's `on_group`: prompt `prompt`'s G captions, decoded as `Rollouts.text` decodes them."""
  stream.add(prompt, tokenizer.batch_decode([t[:n] for t, n in zip(tokens, lengths)], skip_special_tokens=True))


@jax.jit
def _mismatch_fn(old, behaviour, mask):
  flat = lambda x: x.reshape(-1, x.shape[-1])
  return mismatch_metrics(flat(old), flat(behaviour), flat(mask))


@jax.jit
def _truncated_fn(tokens, mask, stop_ids):
  """bool [M, b*G]: no stop token among the caption's tokens (it hit max_new_tokens)."""
  return ~jnp.any(mask & jnp.isin(tokens, stop_ids), axis=-1)
