"""REINFORCE-family advantage estimators from verl (`verl/trainer/ppo/core_algos.py`): REINFORCE++ and its group
baseline variant, GPG, OPO and GRPO pass@k, registered in `ADVANTAGE_ESTIMATORS` beside grpo / dr_grpo / rloo.

Inputs as every estimator (jaxcap.rl.advantages): rewards float [B, G, R], weights [R], valid bool [B, G, R].
Multi-reward inputs combine as in grpo: the scalar s = sum_k w_k r_k of the valid entries, and a rollout is valid
when every weighted dimension is; then verl's outcome-reward formula applies to s (verl has one scalar reward per
response). Invalid rollouts enter no statistic and get advantage 0. `lengths` [B, G] (completion tokens; the
trainer passes them) weigh rollouts where verl's formulas run over tokens (REINFORCE++ whitening, OPO's baseline);
without them every rollout counts once.

Differences from verl, all estimators: a group with fewer than two valid rollouts gets advantage 0 (verl uses a
baseline of 0 for a singleton group, so its advantage is the raw score, or the whitened raw score), and a group (for
reinforce_pp: the batch) whose valid scores are all equal gets exactly 0 (verl: an ulp of float error, whitened);
batch statistics run over the valid rollouts of the [B, G] batch (verl: its whole batch).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxcap.rl.advantages import (
  ADVANTAGE_ESTIMATORS,
  DEFAULT_EPS,
  Advantages,
  _check_inputs,
  _masked_stats,
  _metrics,
  weighted_reward,
)


def _prepare(rewards, weights, valid, lengths):
  rewards, weights, valid = _check_inputs(rewards, weights, valid)
  total, sample_valid = weighted_reward(rewards, weights, valid)
  tokens = jnp.ones(total.shape, total.dtype) if lengths is None else jnp.asarray(lengths, total.dtype)
  stats = _masked_stats(total, sample_valid, axis=1)
  return rewards, valid, total, sample_valid, tokens, stats


def _whiten(x, sample_valid, tokens):
  """verl_F.masked_whiten over the valid tokens of the batch: each rollout counts `tokens` times; unbiased variance
  (n / (n - 1) with n the token count), (x - mean) * rsqrt(var + 1e-8)."""
  w = jnp.where(sample_valid, tokens, 0.0)
  n = jnp.sum(w)
  mean = jnp.sum(w * x) / (n + 1e-8)
  var = jnp.sum(w * (x - mean) ** 2) / (n + 1e-8) * (n / jnp.maximum(n - 1.0, 1e-8))
  return (x - mean) * jax.lax.rsqrt(var + 1e-8)


def _done(rewards, valid, sample_valid, adv, degenerate):
  adv = jnp.where(sample_valid, adv, 0.0)
  return Advantages(adv, sample_valid, _metrics(rewards, valid, sample_valid, adv, degenerate))


def _uses_lengths(fn):
  fn.uses_lengths = True
  return fn


@ADVANTAGE_ESTIMATORS.register("reinforce_pp")
@_uses_lengths
def reinforce_pp_advantages(rewards, weights, valid=None, *, lengths=None) -> Advantages:
  """REINFORCE++ (Hu 2025, arXiv:2501.03262), outcome reward, gamma = 1: the return s on every token, whitened over
  the batch's tokens, A = (s - mean) / sqrt(var + 1e-8) (no group baseline). verl's `reinforce_plus_plus`."""
  rewards, valid, total, sample_valid, tokens, stats = _prepare(rewards, weights, valid, lengths)
  batch = _masked_stats(total, sample_valid, axis=(0, 1))
  adv = jnp.where(batch.degenerate, 0.0, _whiten(total, sample_valid, tokens))  # equal scores: exactly 0
  return _done(rewards, valid, sample_valid, adv, jnp.broadcast_to(batch.degenerate, stats.degenerate.shape))


@ADVANTAGE_ESTIMATORS.register("reinforce_pp_baseline")
@_uses_lengths
def reinforce_pp_baseline_advantages(rewards, weights, valid=None, *, lengths=None) -> Advantages:
  """REINFORCE++-baseline (arXiv:2501.03262): s - mean_G s per group, then whitened over the batch's tokens as
  `reinforce_pp`. verl's `reinforce_plus_plus_baseline`."""
  rewards, valid, total, sample_valid, tokens, stats = _prepare(rewards, weights, valid, lengths)
  live = sample_valid & (stats.count >= 2)
  adv = _whiten(jnp.where(live & ~stats.degenerate, total - stats.mean, 0.0), live, tokens)
  return _done(rewards, valid, live, adv, stats.degenerate)


@ADVANTAGE_ESTIMATORS.register("gpg")
def gpg_advantages(rewards, weights, valid=None, *, f_norm: float = 1.0) -> Advantages:
  """GPG (Chu 2025, arXiv:2504.02546): A = alpha (s - mean_G s) / f_norm, alpha = (rollouts) / (rollouts with a
  non-zero s), over the valid rollouts of the batch (verl: its whole batch). Pair with the `gpg` policy loss."""
  rewards, valid, total, sample_valid, _, stats = _prepare(rewards, weights, valid, None)
  live = sample_valid & (stats.count >= 2)
  n = jnp.sum(sample_valid).astype(total.dtype)
  nonzero = jnp.sum(sample_valid & (total != 0)).astype(total.dtype)
  alpha = n / jnp.maximum(nonzero, 1.0)
  adv = jnp.where(live & ~stats.degenerate, alpha * (total - stats.mean) / f_norm, 0.0)
  return _done(rewards, valid, live, adv, stats.degenerate)


@ADVANTAGE_ESTIMATORS.register("opo")
@_uses_lengths
def opo_advantages(rewards, weights, valid=None, *, lengths=None) -> Advantages:
  """OPO (Hao 2025, arXiv:2505.23585): the optimal baseline of a group is its length-weighted mean score,
  A = s - sum_j |y_j| s_j / sum_j |y_j| (reward units). verl's `opo`."""
  rewards, valid, total, sample_valid, tokens, stats = _prepare(rewards, weights, valid, lengths)
  live = sample_valid & (stats.count >= 2)
  w = jnp.where(sample_valid, tokens, 0.0)
  baseline = jnp.sum(w * total, axis=1, keepdims=True) / jnp.maximum(jnp.sum(w, axis=1, keepdims=True), 1e-8)
  adv = jnp.where(live & ~stats.degenerate, total - baseline, 0.0)
  return _done(rewards, valid, live, adv, stats.degenerate)


@ADVANTAGE_ESTIMATORS.register("grpo_passk")
def grpo_passk_advantages(
  rewards, weights, valid=None, *, eps: float = DEFAULT_EPS, scale_by_std: bool = True
) -> Advantages:
  """GRPO pass@k (Chen 2025, arXiv:2503.19595 as verl cites it): only the group's best rollout learns,
  A = (s_max - s_second) / (std_G s + eps) (std with N - 1; scale_by_std False: no division), 0 for the others.
  The best is the first maximum (torch.topk's choice among ties is unspecified; a tie gives A = 0 anyway)."""
  rewards, valid, total, sample_valid, _, stats = _prepare(rewards, weights, valid, None)
  if total.shape[1] < 2:  # no group has a second rollout
    return _done(rewards, valid, sample_valid & False, jnp.zeros_like(total), stats.degenerate)
  masked = jnp.where(sample_valid, total, -jnp.inf)
  best = jnp.argmax(masked, axis=1)
  top2 = jax.lax.top_k(masked, 2)[0]
  gap = jnp.where(stats.degenerate[:, 0], 0.0, top2[:, 0] - top2[:, 1])
  if scale_by_std:
    gap = gap / (stats.std[:, 0] + eps)
  live = stats.count[:, 0] >= 2
  is_best = jax.nn.one_hot(best, total.shape[1], dtype=bool) & live[:, None]
  adv = jnp.where(is_best, gap[:, None], 0.0)
  return _done(rewards, valid, sample_valid & live[:, None], adv, stats.degenerate)
