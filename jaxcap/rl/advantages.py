"""Group-relative advantages from a [B, G, R] reward tensor.

Shapes: B prompts (images), G rollouts (captions) per prompt, R reward dimensions.
Every estimator takes

    rewards  float [B, G, R]   raw reward per rollout and dimension
    weights  float [R]         reward weights w_k
    valid    bool  [B, G, R]   False where the judge failed (a missing reward, not a reward of 0)

and returns an `Advantages` tuple: advantages float32 [B, G], sample_valid bool [B, G] and a metrics dict.

A rollout is valid (enters the loss) when every reward dimension with a non-zero weight is valid. Invalid
entries are excluded from every mean and std; their advantage is 0 and `sample_valid` marks them so the
policy loss can drop them.

Std estimator: the unbiased (N - 1) sample std over the valid entries of the group, as TRL/verl GRPO;
advantages divide by (std + eps) with eps = 1e-6. A group with fewer than two valid rollouts, or whose
valid values are all exactly equal, has no learning signal: its advantages are exactly 0 (an exact
max == min test, because a float mean of equal values can differ from them by an ulp and
ulp / (0 + eps) is not small).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp

from jaxcap.registry import Registry

DEFAULT_EPS = 1e-6

# name -> estimator(rewards [B, G, R], weights [R], valid [B, G, R] | None, **options) -> Advantages
ADVANTAGE_ESTIMATORS: Registry[Callable[..., "Advantages"]] = Registry("advantage estimator", field="rl.estimator")


class Advantages(NamedTuple):
  """Output of every estimator; a pytree, so it passes through jit and vmap.

  metrics: reward_mean float [R] (mean of each dimension over its valid entries), frac_valid_samples,
  frac_degenerate_groups (groups with zero advantage; for c-GDPO the fraction of (group, dimension) pairs
  with zero variance), advantage_mean (over valid rollouts), advantage_abs_max.
  """

  advantages: jax.Array  # float32 [B, G]
  sample_valid: jax.Array  # bool [B, G]
  metrics: dict[str, jax.Array]


class _MaskedStats(NamedTuple):
  count: jax.Array
  mean: jax.Array
  std: jax.Array  # unbiased (N - 1); 1 where degenerate so divisions stay finite
  degenerate: jax.Array  # fewer than 2 valid entries, or all valid entries equal


def _masked_stats(x: jax.Array, mask: jax.Array, axis) -> _MaskedStats:
  """Mean / unbiased std of x over `axis`, counting only entries where mask is True (keepdims)."""
  count = jnp.sum(mask, axis=axis, keepdims=True).astype(x.dtype)
  mean = jnp.sum(jnp.where(mask, x, 0.0), axis=axis, keepdims=True) / jnp.maximum(count, 1.0)
  centred = jnp.where(mask, x - mean, 0.0)
  var = jnp.sum(centred * centred, axis=axis, keepdims=True) / jnp.maximum(count - 1.0, 1.0)
  hi = jnp.max(jnp.where(mask, x, -jnp.inf), axis=axis, keepdims=True)
  lo = jnp.min(jnp.where(mask, x, jnp.inf), axis=axis, keepdims=True)
  degenerate = (count < 2) | ~(hi > lo)
  # sqrt'(0) is infinite; keep the derivative finite even though advantages are normally not differentiated.
  std = jnp.sqrt(jnp.where(degenerate, 1.0, var))
  return _MaskedStats(count, mean, std, degenerate)


def _check_inputs(rewards, weights, valid):
  chex.assert_rank(rewards, 3)
  chex.assert_rank(weights, 1)
  chex.assert_type(rewards, float)
  chex.assert_type(weights, float)
  chex.assert_axis_dimension(weights, 0, rewards.shape[-1])
  if valid is None:
    valid = jnp.ones(rewards.shape, dtype=bool)
  chex.assert_equal_shape([rewards, valid])
  chex.assert_type(valid, bool)
  dtype = jnp.promote_types(rewards.dtype, jnp.float32)
  return rewards.astype(dtype), weights.astype(dtype), valid


def sample_validity(valid: jax.Array, weights: jax.Array) -> jax.Array:
  """bool [B, G]: every reward dimension that carries weight was judged successfully."""
  return jnp.all(valid | (weights == 0), axis=-1)


def reward_means(rewards: jax.Array, valid: jax.Array) -> jax.Array:
  """float [R]: mean of each reward dimension over its valid entries (0 where none is valid)."""
  count = jnp.sum(valid, axis=(0, 1)).astype(rewards.dtype)
  return jnp.sum(jnp.where(valid, rewards, 0.0), axis=(0, 1)) / jnp.maximum(count, 1.0)


def _metrics(rewards, valid, sample_valid, advantages, degenerate) -> dict[str, jax.Array]:
  adv = _masked_stats(advantages, sample_valid, axis=(0, 1))
  return {
    "reward_mean": reward_means(rewards, valid),  # [R], one entry per reward dimension
    "frac_valid_samples": jnp.mean(sample_valid.astype(jnp.float32)),
    "frac_degenerate_groups": jnp.mean(degenerate.astype(jnp.float32)),
    "advantage_mean": adv.mean[0, 0],
    "advantage_abs_max": jnp.max(jnp.abs(advantages)),
  }


def weighted_reward(rewards: jax.Array, weights: jax.Array, valid: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Scalar reward sum_k w_k r_k [B, G] and its validity [B, G] (invalid entries contribute 0, not used)."""
  sample_valid = sample_validity(valid, weights)
  total = jnp.sum(jnp.where(valid, rewards, 0.0) * weights, axis=-1)
  return total, sample_valid


def _sum_then_normalise(rewards, weights, valid, *, scale_by_std: bool, eps: float, loo: bool) -> Advantages:
  rewards, weights, valid = _check_inputs(rewards, weights, valid)
  total, sample_valid = weighted_reward(rewards, weights, valid)
  stats = _masked_stats(total, sample_valid, axis=1)
  centred = total - stats.mean
  if scale_by_std:
    adv = centred / (stats.std + eps)
  elif loo:
    # r_i - mean_{j != i} r_j == n / (n - 1) * (r_i - mean_j r_j) over the n valid rollouts.
    adv = centred * stats.count / jnp.maximum(stats.count - 1.0, 1.0)
  else:
    adv = centred
  adv = jnp.where(sample_valid & ~stats.degenerate, adv, 0.0)
  return Advantages(adv, sample_valid, _metrics(rewards, valid, sample_valid, adv, stats.degenerate))


@ADVANTAGE_ESTIMATORS.register("grpo")
def grpo_advantages(rewards, weights, valid=None, *, eps: float = DEFAULT_EPS) -> Advantages:
  """GRPO: s = sum_k w_k r_k, then A = (s - mean_G s) / (std_G s + eps), std with N - 1.

  Args: rewards float [B, G, R], weights float [R], valid bool [B, G, R] (None = all valid).
  Returns advantages float32 [B, G] (unitless, ~unit variance per group) and sample_valid bool [B, G].
  Invariant to r -> a * r + b for a > 0 (up to eps). Collapses reward vectors that share w . r
  (BalCapRL Proposition 1).
  """
  return _sum_then_normalise(rewards, weights, valid, scale_by_std=True, eps=eps, loo=False)


@ADVANTAGE_ESTIMATORS.register("dr_grpo")
def dr_grpo_advantages(rewards, weights, valid=None) -> Advantages:
  """Dr.GRPO: A = s - mean_G s with s = sum_k w_k r_k; no std division (in reward units).

  Shapes as `grpo_advantages`. Pair with the "seq-mean-token-sum-norm" loss aggregation.
  """
  return _sum_then_normalise(rewards, weights, valid, scale_by_std=False, eps=0.0, loo=False)


@ADVANTAGE_ESTIMATORS.register("rloo")
def rloo_advantages(rewards, weights, valid=None) -> Advantages:
  """RLOO: A_i = s_i - mean_{j != i} s_j = G / (G - 1) * (s_i - mean_G s) (reward units).

  G is the number of valid rollouts in the group. Shapes as `grpo_advantages`.
  """
  return _sum_then_normalise(rewards, weights, valid, scale_by_std=False, eps=0.0, loo=True)


@ADVANTAGE_ESTIMATORS.register("c_gdpo")
def c_gdpo_advantages(
  rewards, weights, valid=None, *, eps: float = DEFAULT_EPS, normalize_batch: bool = True
) -> Advantages:
  """c-GDPO (BalCapRL): per-dimension group normalisation, weighted sum, then whitening over the batch.

  A_k = (r_k - mean_G r_k) / (std_G r_k + eps) for each k separately, using only the rollouts whose
  dimension k is valid (std with N - 1; a zero-variance dimension contributes 0); A_sum = sum_k w_k A_k;
  then A = (A_sum - mean_B A_sum) / (std_B A_sum + eps) over all valid rollouts of the batch (N - 1 std).
  The batch statistics are reductions over the B and G axes: under a sharded mesh they are global, under
  vmap they are per mapped slice. Shapes as `grpo_advantages`; the output is unitless.
  """
  rewards, weights, valid = _check_inputs(rewards, weights, valid)
  sample_valid = sample_validity(valid, weights)
  stats = _masked_stats(rewards, valid, axis=1)  # [B, 1, R]
  per_dim = (rewards - stats.mean) / (stats.std + eps)
  per_dim = jnp.where(valid & ~stats.degenerate, per_dim, 0.0)
  summed = jnp.sum(per_dim * weights, axis=-1)
  summed = jnp.where(sample_valid, summed, 0.0)
  if normalize_batch:
    batch = _masked_stats(summed, sample_valid, axis=(0, 1))
    adv = jnp.where(sample_valid & ~batch.degenerate, (summed - batch.mean) / (batch.std + eps), 0.0)
  else:
    adv = summed
  return Advantages(adv, sample_valid, _metrics(rewards, valid, sample_valid, adv, stats.degenerate))


def group_advantages(rewards, weights, valid=None, *, estimator: str = "grpo", **kwargs) -> Advantages:
  """Dispatch to one registered estimator by name (`ADVANTAGE_ESTIMATORS`); `estimator` is static under jit.

  Extra keyword arguments go to the estimator: eps (grpo, c_gdpo) and normalize_batch (c_gdpo, a Python
  bool, static under jit).
  """
  return ADVANTAGE_ESTIMATORS[estimator](rewards, weights, valid, **kwargs)
