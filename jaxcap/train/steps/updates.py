"""The update steps: pure functions (state, batch) -> (state, metrics), jit-compiled with donated state.

Batches carry a leading micro-batch axis M; gradients are accumulated over it with `lax.scan`, so memory is
bounded by one micro-batch. Each micro-batch has its own vision layout (images of any sizes), all padded to one
`LayoutShape`, which keeps the scan shape-static.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxcap.models.vision import VisionLayout
from jaxcap.rl import ADVANTAGE_ESTIMATORS, POLICY_LOSSES, PolicyLossConfig, group_advantages, policy_loss
from jaxcap.rl.rollout_correction import RolloutCorrectionConfig, rollout_correction
from jaxcap.train.steps.accumulate import accumulate, apply_update, per_micro, vision_input
from jaxcap.train.steps.batches import PromptBatch, RolloutBatch
from jaxcap.train.steps.logprobs import completion_logprobs
from jaxcap.train.steps.state import TrainState

__all__ = ["PromptBatch", "RolloutBatch", "rl_advantages", "rl_step", "sequence_logprobs", "sft_step"]


def sequence_logprobs(
  graphdef, params, prompts: PromptBatch, layout: VisionLayout | None, tokens: jax.Array
) -> jax.Array:
  """Teacher-forced log-probs [M, b*G, C] of `tokens` under `params`, one micro-batch at a time (no grad).
  `layout`: one per micro-batch [M, ...] or one shared by all."""

  def one(_, xs):
    pb, lay, tk = xs
    model = nnx.merge(graphdef, params)
    lp, _ = completion_logprobs(model, pb.ids, pb.positions, pb.mask, vision_input(pb.pixel_values, lay), tk)
    return None, lp

  _, out = jax.lax.scan(one, None, (prompts, per_micro(layout, tokens.shape[0]), tokens))
  return out


def rl_advantages(rollouts: RolloutBatch, weights: jax.Array, estimator: str, estimator_kwargs: dict | None = None):
  """Advantages over the whole step's batch (c-GDPO whitens across it): [M, b*G] and validity [M, b*G]."""
  m, b, g, r = rollouts.rewards.shape
  kwargs = dict(estimator_kwargs or {})
  if getattr(ADVANTAGE_ESTIMATORS[estimator], "uses_lengths", False):  # token-weighted statistics (opo, reinforce_pp)
    kwargs["lengths"] = jnp.sum(rollouts.mask, axis=-1).reshape(m * b, g)
  adv = group_advantages(
    rollouts.rewards.reshape(m * b, g, r),
    weights,
    rollouts.reward_valid.reshape(m * b, g, r),
    estimator=estimator,
    **kwargs,
  )
  return adv.advantages.reshape(m, b * g), adv.sample_valid.reshape(m, b * g), adv.metrics


def rl_terms(
  rollouts: RolloutBatch,
  loss_config: PolicyLossConfig,
  estimator: str,
  correction: RolloutCorrectionConfig | None,
  mask_truncated: bool,
):
  """The per-sequence inputs of the policy loss over the whole step's batch, in the update's layout [M, b*G, ...]:
  (advantages, sample_valid, old and ref log-probs (detached), the completion mask after any rollout correction,
  extra loss inputs (is_weights), advantage metrics, truncation / correction metrics). See `rl_step`."""
  advantages, sample_valid, adv_metrics = rl_advantages(rollouts, rollouts.weights, estimator)
  old = jax.lax.stop_gradient(rollouts.old_logprobs)
  ref = None if rollouts.ref_logprobs is None else jax.lax.stop_gradient(rollouts.ref_logprobs)
  if loss_config.kl_coef > 0 and ref is None:
    raise ValueError("loss_config.kl_coef > 0 needs rollouts.ref_logprobs")
  cmask, extras, extra_metrics = rollouts.mask, {}, {}
  if mask_truncated:
    if rollouts.truncated is None:
      raise ValueError("mask_truncated needs rollouts.truncated")
    valid_before = sample_valid
    sample_valid = sample_valid & ~rollouts.truncated
    extra_metrics["truncated/frac"] = jnp.mean(rollouts.truncated.astype(jnp.float32))
    extra_metrics["truncated/masked_frac"] = jnp.mean((valid_before & rollouts.truncated).astype(jnp.float32))
  if correction is not None and correction.enabled:
    if rollouts.behaviour_logprobs is None:
      raise ValueError("rollout correction needs rollouts.behaviour_logprobs (the sampler's log-probs)")
    shape = old.shape
    flat = lambda x: x.reshape(-1, shape[-1])
    is_w, keep, corr_metrics = rollout_correction(
      flat(old), flat(jax.lax.stop_gradient(rollouts.behaviour_logprobs)), flat(cmask), correction
    )
    cmask = keep.reshape(shape)
    if is_w is not None:
      extras["is_weights"] = is_w.reshape(shape)
    extra_metrics.update({f"rollout_corr/{k}": v for k, v in corr_metrics.items()})
  return advantages, sample_valid, old, ref, cmask, extras, adv_metrics, extra_metrics


def surrogate_keys(state: TrainState, num_micro: int) -> jax.Array:
  """One PRNG key per micro-batch for surrogates that draw (clip_cov), from the state's key and step."""
  return jax.random.split(jax.random.fold_in(jax.random.fold_in(state.key, 29), state.step), num_micro)


def micro_weights(cmask: jax.Array, sample_valid: jax.Array, aggregation: str) -> jax.Array:
  """Each micro-batch's share of the step's loss [M] from its mask [M, n, C] and valid sequences [M, n]: its tokens
  (token-mean) or its sequences (seq-mean-*), so that the micro-batches' weighted losses are the whole batch's."""
  counted = cmask & sample_valid[..., None]
  if aggregation == "token-mean":
    return jnp.sum(counted, axis=(1, 2))  # tokens per micro-batch
  return jnp.sum(jnp.any(counted, axis=2), axis=1)  # sequences per micro-batch


def rl_step(
  state: TrainState,
  prompts: PromptBatch,
  rollouts: RolloutBatch,
  layout: VisionLayout | None,
  *,
  graphdef,
  optimizer: optax.GradientTransformation,
  loss_config: PolicyLossConfig,
  estimator: str = "grpo",
  master_update: str = "exact",
  max_update_ratio: float = 0.0,
  correction: RolloutCorrectionConfig | None = None,
  mask_truncated: bool = False,
) -> tuple[TrainState, dict[str, jax.Array]]:
  """One policy-gradient update: advantages from rewards (over the whole batch), the policy loss accumulated
  over micro-batches, one optimizer step (landing on the params as `master_update`, the phase's
  `optim.master_update`, says). Old / reference log-probs come precomputed in `rollouts`, so the caller can
  overlap computing them with judging.

  `correction` (enabled): importance weights / rejection between `rollouts.behaviour_logprobs` and the old
  log-probs, over the whole batch (metrics `rollout_corr/*`). `mask_truncated`: rollouts flagged
  `rollouts.truncated` keep their place in the group statistics but carry no gradient (metrics
  `truncated/frac`, `truncated/masked_frac`). With neither, the program is the plain one."""
  advantages, sample_valid, old, ref, cmask, extras, adv_metrics, extra_metrics = rl_terms(
    rollouts, loss_config, estimator, correction, mask_truncated
  )
  if POLICY_LOSSES[loss_config.policy].uses_key:
    extras["key"] = surrogate_keys(state, rollouts.tokens.shape[0])

  def loss_fn(params, mb):
    pb, lay, tokens, mask, old_lp, ref_lp, adv, valid, extra = mb
    model = nnx.merge(graphdef, params)
    lp, ent = completion_logprobs(
      model, pb.ids, pb.positions, pb.mask, vision_input(pb.pixel_values, lay), tokens, with_entropy=True
    )
    loss, metrics = policy_loss(
      lp, old_lp, adv, mask, loss_config, ref_logprobs=ref_lp, sample_valid=valid, entropy=ent, **extra
    )
    return loss, metrics

  layouts = per_micro(layout, rollouts.tokens.shape[0])
  batches = (prompts, layouts, rollouts.tokens, cmask, old, ref, advantages, sample_valid, extras)
  weights = micro_weights(cmask, sample_valid, loss_config.loss_aggregation)
  loss, metrics, grads = accumulate(loss_fn, state.params, batches, weights, trains_base=state.trains_base)
  state, opt_metrics = apply_update(state, grads, optimizer, master_update, loss, max_update_ratio)
  adv_metrics = {f"adv/{k}": v for k, v in adv_metrics.items()}
  return state, {"loss": loss, **metrics, **opt_metrics, **adv_metrics, **extra_metrics}


def sft_step(
  state: TrainState,
  prompts: PromptBatch,
  targets: jax.Array,
  target_mask: jax.Array,
  layout: VisionLayout | None,
  *,
  graphdef,
  optimizer: optax.GradientTransformation,
  master_update: str = "exact",
  max_update_ratio: float = 0.0,
) -> tuple[TrainState, dict[str, jax.Array]]:
  """Supervised fine-tuning on target captions: token-mean negative log-likelihood; `master_update` as in
  `rl_step`.

  targets int [M, b, C], target_mask bool [M, b, C] (the caption and its end-of-turn token)."""

  def loss_fn(params, mb):
    pb, lay, tokens, mask = mb
    model = nnx.merge(graphdef, params)
    lp, _ = completion_logprobs(model, pb.ids, pb.positions, pb.mask, vision_input(pb.pixel_values, lay), tokens)
    mask = mask.astype(jnp.float32)
    nll = -jnp.sum(lp * mask) / jnp.maximum(jnp.sum(mask), 1.0)
    return nll, {"nll": nll}

  weights = jnp.sum(target_mask, axis=(1, 2))
  batches = (prompts, per_micro(layout, targets.shape[0]), targets, target_mask)
  loss, metrics, grads = accumulate(loss_fn, state.params, batches, weights, trains_base=state.trains_base)
  state, opt_metrics = apply_update(state, grads, optimizer, master_update, loss, max_update_ratio)
  return state, {"loss": loss, **metrics, **opt_metrics}
