"""Rollout correction: importance weights and rejection between the behaviour policy (the sampler's log-probs) and
the policy the update's old log-probs come from, and the mismatch metrics between the two.

The sampler decodes with its own program (bfloat16, a KV cache, a different reduction order), so its log-probs
differ from the training program's even at the same parameters; a stale sampler (off-policy training) adds a policy
gap. With rho = pi_old / pi_behaviour per token (log rho = old - behaviour):
- TIS (truncated IS, `is_level` token / sequence): w = min(rho, C) per token, or w = min(prod_t rho_t, C) on
  every token of the sequence (C = `is_threshold`); the weights multiply the surrogate's token loss.
- rejection (`reject`, verl's rollout_rs options): tokens or whole sequences whose divergence estimate leaves a
  band are masked out of the loss; MIS (masked IS) is `token_k1` / `seq_sum_k1` with ratio bounds
  [reject_lower, reject_upper].
Formulas follow verl's `verl/trainer/ppo/rollout_corr_helper.py` (compute_rollout_correction_weights,
compute_rollout_rejection_mask, compute_offpolicy_metrics); log-ratios are clamped to +-20 before exp as there.
Differences: weights are not batch-normalised (verl's rollout_is_batch_normalize, off by default there); one
rejection option at a time (verl chains several with commas); metrics are a chosen subset, named below.

Shapes: N sequences, T tokens; log-probs float [N, T]; mask [N, T] (1 on generated tokens).
"""

from __future__ import annotations

import dataclasses
import math

import chex
import jax
import jax.numpy as jnp

from jaxcap.rl.aggregation import masked_mean

SAFETY_BOUND = 20.0
IS_LEVELS = ("none", "token", "sequence")
REJECTIONS = ("none", "token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3")
REJECTIONS += ("seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")


@dataclasses.dataclass(frozen=True)
class RolloutCorrectionConfig:
  """is_level: "none", "token" or "sequence" importance weights (TIS), truncated above at is_threshold.
  reject: "none" or a verl rollout_rs option (`REJECTIONS`): "<token|seq_sum|seq_mean|seq_max>_<k1|k2|k3>", the
    divergence of log rho' = behaviour - old per token (k1 = log rho', k2 = log rho'^2 / 2, k3 = exp(-log rho') +
    log rho' - 1, verl's signs), summed / averaged / maximised per sequence for seq_*. k1 options keep
    log(reject_lower) <= k1 <= log(reject_upper) (reject_lower None: 1 / reject_upper); k2 / k3 keep
    k <= reject_upper."""

  is_level: str = "none"
  is_threshold: float = 2.0
  reject: str = "none"
  reject_upper: float = 2.0
  reject_lower: float | None = None

  def __post_init__(self):
    if self.is_level not in IS_LEVELS:
      raise ValueError(f"rl.rollout_correction.is_level={self.is_level!r}: choose one of {', '.join(IS_LEVELS)}")
    if self.reject not in REJECTIONS:
      raise ValueError(f"rl.rollout_correction.reject={self.reject!r}: choose one of {', '.join(REJECTIONS)}")
    if self.is_threshold <= 0 or self.reject_upper <= 0 or (self.reject_lower is not None and self.reject_lower <= 0):
      raise ValueError("rl.rollout_correction: is_threshold, reject_upper and reject_lower must be positive")

  @property
  def enabled(self) -> bool:
    return self.is_level != "none" or self.reject != "none"


def mismatch_metrics(old_logprobs: jax.Array, behaviour_logprobs: jax.Array, mask: jax.Array) -> dict[str, jax.Array]:
  """How far the training program's log-probs are from the sampler's (verl's compute_offpolicy_metrics), scalars:
  kl_k1 = mean_t (behaviour - old) (KL(pi_behaviour || pi_old), nats per token), kl_k3 = mean_t (rho - log rho - 1),
  training_log_ppl / rollout_log_ppl = mean_i (-mean_t log p), log_ppl_diff = mean_i (mean_t behaviour - mean_t old)
  (verl's sign: > 0 when the trainer finds the captions less likely), log_ppl_abs_diff, chi2_token =
  mean_t rho^2 - 1. Token means over unmasked tokens; sequence means over all N rows (as verl; a row without
  tokens counts as 0). All ~0 when the two compute the same numbers."""
  chex.assert_equal_shape([old_logprobs, behaviour_logprobs, mask])
  old = old_logprobs.astype(jnp.float32)
  beh = behaviour_logprobs.astype(jnp.float32)
  mask = mask.astype(jnp.float32)
  log_ratio = old - beh
  n = jnp.sum(mask, axis=-1)
  mean_old = jnp.sum(old * mask, axis=-1) / (n + 1e-8)  # verl_F.masked_mean(axis=-1), its 1e-8
  mean_beh = jnp.sum(beh * mask, axis=-1) / (n + 1e-8)
  diff = mean_beh - mean_old
  rho = jnp.exp(jnp.clip(log_ratio, -SAFETY_BOUND, SAFETY_BOUND))
  return {
    "kl_k1": masked_mean(beh - old, mask),
    "kl_k3": masked_mean(jnp.exp(log_ratio) - log_ratio - 1.0, mask),
    "training_log_ppl": jnp.mean(-mean_old),
    "rollout_log_ppl": jnp.mean(-mean_beh),
    "log_ppl_diff": jnp.mean(diff),
    "log_ppl_abs_diff": jnp.mean(jnp.abs(diff)),
    "chi2_token": masked_mean(rho * rho, mask) - 1.0,
  }


def importance_weights(log_ratio: jax.Array, mask: jax.Array, level: str, threshold: float):
  """TIS weights [N, T] (0 on masked tokens, detached) and metrics: is_mean (before truncation, over tokens),
  is_max (the largest weight before truncation), is_truncated_frac (share of tokens, or for "sequence" of rows,
  whose weight exceeds the threshold). verl's compute_rollout_correction_weights / compute_is_metrics."""
  if level == "token":
    w = jnp.exp(jnp.clip(log_ratio, -SAFETY_BOUND, SAFETY_BOUND)) * mask
    high = masked_mean((w > threshold).astype(w.dtype), mask)
    w_max = jnp.max(jnp.where(mask > 0, w, -jnp.inf))
  elif level == "sequence":
    seq = jnp.sum(log_ratio * mask, axis=-1, keepdims=True)
    w = jnp.broadcast_to(jnp.exp(jnp.clip(seq, -SAFETY_BOUND, SAFETY_BOUND)), log_ratio.shape) * mask
    high = jnp.mean((seq > math.log(threshold)).astype(w.dtype))
    w_max = jnp.exp(jnp.minimum(jnp.max(seq), SAFETY_BOUND))
  else:
    raise ValueError(f"is_level={level!r}: choose token or sequence")
  metrics = {"is_mean": masked_mean(w, mask), "is_max": w_max, "is_truncated_frac": high}
  return jax.lax.stop_gradient(jnp.minimum(w, threshold)), metrics


def rejection_keep(log_ratio: jax.Array, mask: jax.Array, option: str, upper: float, lower: float | None = None):
  """bool [N, T]: tokens kept by the rejection `option` (verl's compute_rollout_rejection_mask, one option), and
  metrics reject_token_frac (share of unmasked tokens rejected), reject_seq_frac (share of all rows with a rejected
  token, verl's rollout_rs_seq_masked_fraction)."""
  d = jnp.clip(log_ratio, -SAFETY_BOUND, SAFETY_BOUND)
  level, kind = option.rsplit("_", 1)
  per_token = {"k1": -d, "k2": 0.5 * d * d, "k3": jnp.exp(d) - 1.0 - d}[kind]
  if level == "token":
    stat = per_token
  elif level == "seq_sum":
    stat = jnp.sum(per_token * mask, axis=-1, keepdims=True)
  elif level == "seq_mean":
    stat = jnp.sum(per_token * mask, axis=-1, keepdims=True) / (jnp.sum(mask, axis=-1, keepdims=True) + 1e-8)
  elif level == "seq_max":
    m = jnp.max(jnp.where(mask > 0, per_token, -jnp.inf), axis=-1, keepdims=True)
    stat = jnp.where(m == -jnp.inf, 0.0, m)
  else:
    raise ValueError(f"reject={option!r}: unknown level {level!r}")
  if kind == "k1":
    lo = 1.0 / upper if lower is None else lower
    keep = (stat >= math.log(lo)) & (stat <= math.log(upper))
  else:
    keep = stat <= upper
  keep = jnp.broadcast_to(keep, log_ratio.shape)
  valid = mask > 0
  metrics = {
    "reject_token_frac": masked_mean((~keep).astype(d.dtype), mask),
    "reject_seq_frac": jnp.mean(jnp.any(~keep & valid, axis=-1).astype(d.dtype)),
  }
  return keep, metrics


def rollout_correction(
  old_logprobs: jax.Array, behaviour_logprobs: jax.Array, mask: jax.Array, config: RolloutCorrectionConfig
) -> tuple[jax.Array | None, jax.Array, dict[str, jax.Array]]:
  """(IS weights float [N, T] or None, keep bool [N, T] (mask after rejection), metrics) for `config`; metrics are
  those of `importance_weights` and `rejection_keep` that apply. Computed once over the whole step's batch, before
  the update (the weights do not depend on the policy being trained)."""
  chex.assert_equal_shape([old_logprobs, behaviour_logprobs, mask])
  fmask = mask.astype(jnp.float32)
  log_ratio = old_logprobs.astype(jnp.float32) - behaviour_logprobs.astype(jnp.float32)
  weights, metrics = None, {}
  if config.is_level != "none":
    weights, m = importance_weights(log_ratio, fmask, config.is_level, config.is_threshold)
    metrics.update(m)
  keep = mask.astype(bool)
  if config.reject != "none":
    kept, m = rejection_keep(log_ratio, fmask, config.reject, config.reject_upper, config.reject_lower)
    keep = keep & kept
    metrics.update(m)
  return weights, keep, metrics
