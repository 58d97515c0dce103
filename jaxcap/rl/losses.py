"""PPO-style clipped policy loss with clip-higher, dual-clip, KL to a reference policy and loss aggregation.

Shapes: N sequences (B * G rollouts flattened), T completion tokens. Log-probs are natural-log
probabilities of the sampled tokens, float [N, T]; advantages are per sequence, float [N], broadcast over
its tokens; completion_mask is [N, T] (1 / True on generated tokens, 0 on prompt and padding).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import chex
import jax
import jax.numpy as jnp

from jaxcap.registry import Registry

# name -> aggregate(seq_sum [N], seq_tokens [N], length) -> scalar; see `aggregate_loss`
LOSS_AGGREGATIONS: Registry[Callable[..., jax.Array]] = Registry("loss aggregation", field="rl.loss.aggregation")
# name -> estimate(d [N, T]) -> per-token KL [N, T], with d = log pi_ref - log pi; see `kl_penalty`
KL_ESTIMATORS: Registry[Callable[[jax.Array], jax.Array]] = Registry("KL estimator", field="rl.loss.kl_estimator")


@dataclasses.dataclass(frozen=True)
class PolicyLossConfig:
  """Hyper-parameters of `policy_loss`; frozen and hashable, so it can be a static jit argument.

  eps_low, eps_high: the ratio is clipped to [1 - eps_low, 1 + eps_high]; eps_high > eps_low is
    "clip-higher" (DAPO uses 0.28), which leaves room to raise unlikely tokens.
  dual_clip_c: for negative advantages the token loss is capped at -A * c (c = 3), so a huge ratio on a
    bad token cannot blow up the update; None disables it.
  log_ratio_clamp: log(pi / pi_old) and log(pi_ref / pi) are clamped to [-v, v] before exp.
  aggregation: how token losses become one scalar, see `aggregate_loss`.
  max_gen_len: the Dr.GRPO constant for "seq-mean-token-sum-norm" (the maximum generation length,
    in tokens); None uses T of the batch, which is only constant if batches are padded to that length.
  kl_coef, kl_estimator: weight and estimator ("k1", "k2", "k3") of the per-token KL to the reference
    policy; 0 disables it (BalCapRL, released CapRL).
  entropy_coef: weight of an entropy bonus (subtracted from the loss); needs `entropy` or `logits`.
  """

  eps_low: float = 0.2
  eps_high: float = 0.2
  dual_clip_c: float | None = 3.0
  log_ratio_clamp: float = 20.0
  aggregation: str = "token-mean"
  max_gen_len: int | None = None
  kl_coef: float = 0.0
  kl_estimator: str = "k3"
  entropy_coef: float = 0.0

  def __post_init__(self):
    if self.eps_low < 0 or self.eps_high < 0 or self.eps_low >= 1:
      raise ValueError(f"need 0 <= eps_low < 1 and eps_high >= 0, got {self.eps_low}, {self.eps_high}")
    if self.dual_clip_c is not None and self.dual_clip_c <= 1.0:
      raise ValueError(f"dual_clip_c must exceed 1, got {self.dual_clip_c}")
    LOSS_AGGREGATIONS[self.aggregation]  # raises, naming the known ones
    KL_ESTIMATORS[self.kl_estimator]
    if self.max_gen_len is not None and self.max_gen_len <= 0:
      raise ValueError(f"max_gen_len must be positive, got {self.max_gen_len}")


def kl_penalty(
  logprobs: jax.Array, ref_logprobs: jax.Array, estimator: str = "k3", log_ratio_clamp: float = 20.0
) -> jax.Array:
  """Per-token estimate of KL(pi || pi_ref) from tokens sampled from pi, float [N, T] (nats).

  With d = log pi_ref - log pi: k1 = -d (unbiased, high variance), k2 = d^2 / 2 (biased, low variance),
  k3 = exp(d) - d - 1 (unbiased, non-negative, low variance; Schulman 2020).
  """
  d = jnp.clip(ref_logprobs - logprobs, -log_ratio_clamp, log_ratio_clamp)
  return KL_ESTIMATORS[estimator](d)


KL_ESTIMATORS.register("k1", lambda d: -d)
KL_ESTIMATORS.register("k2", lambda d: 0.5 * d * d)
KL_ESTIMATORS.register("k3", lambda d: jnp.exp(d) - d - 1.0)


def entropy_from_logits(logits: jax.Array) -> jax.Array:
  """Entropy of the next-token distribution, float32 [N, T] (nats), from logits [N, T, V]."""
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


def aggregate_loss(
  token_loss: jax.Array, mask: jax.Array, mode: str = "token-mean", max_gen_len: int | None = None
) -> jax.Array:
  """Reduce per-token losses [N, T] with a 0/1 mask [N, T] to a scalar.

  token-mean:              sum_{i,t} m l / sum_{i,t} m   (every token weighs the same; DAPO)
  seq-mean-token-sum:      mean_i sum_t m l              (BalCapRL's "token-sum, sequence-mean")
  seq-mean-token-mean:     mean_i (sum_t m l / sum_t m)  (original GRPO; favours short sequences)
  seq-mean-token-sum-norm: mean_i sum_t m l / L          (Dr.GRPO, L = max_gen_len or T)
  mean_i runs over sequences with at least one unmasked token; empty inputs give 0, not NaN.
  Versus current verl (`agg_loss` in verl/trainer/ppo/core_algos.py): with its engine workers, token-mean and the
  seq-mean-* modes divide by the global mini-batch's token count / sequence count (times dp_size, undoing the
  data-parallel gradient average), which is what these give when handed the whole batch, except that verl's sequence
  count is the mini-batch size, fully masked sequences included. verl's seq-mean-token-sum-norm is sum_{i,t} m l / L
  (L = its loss_scale_factor, default T) with no mean over sequences and no global-batch or dp_size normalisation;
  here it is also divided by the number of sequences, so the scale does not grow with the batch.
  """
  chex.assert_rank([token_loss, mask], 2)
  chex.assert_equal_shape([token_loss, mask])
  mask = mask.astype(token_loss.dtype)
  seq_tokens = jnp.sum(mask, axis=-1)
  seq_sum = jnp.sum(token_loss * mask, axis=-1)
  length = token_loss.shape[-1] if max_gen_len is None else max_gen_len
  return LOSS_AGGREGATIONS[mode](seq_sum, seq_tokens, length)


def _num_seqs(seq_tokens):
  """Sequences with at least one unmasked token (at least 1, so empty inputs give 0, not NaN)."""
  return jnp.maximum(jnp.sum(seq_tokens > 0).astype(seq_tokens.dtype), 1.0)


@LOSS_AGGREGATIONS.register("token-mean")
def token_mean(seq_sum, seq_tokens, length):
  return jnp.sum(seq_sum) / jnp.maximum(jnp.sum(seq_tokens), 1.0)


@LOSS_AGGREGATIONS.register("seq-mean-token-sum")
def seq_mean_token_sum(seq_sum, seq_tokens, length):
  return jnp.sum(seq_sum) / _num_seqs(seq_tokens)


@LOSS_AGGREGATIONS.register("seq-mean-token-mean")
def seq_mean_token_mean(seq_sum, seq_tokens, length):
  return jnp.sum(seq_sum / jnp.maximum(seq_tokens, 1.0)) / _num_seqs(seq_tokens)


@LOSS_AGGREGATIONS.register("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(seq_sum, seq_tokens, length):
  return jnp.sum(seq_sum) / (_num_seqs(seq_tokens) * length)


def _masked_mean(x, mask):
  return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def policy_loss(
  logprobs: jax.Array,
  old_logprobs: jax.Array,
  advantages: jax.Array,
  completion_mask: jax.Array,
  config: PolicyLossConfig = PolicyLossConfig(),
  *,
  ref_logprobs: jax.Array | None = None,
  sample_valid: jax.Array | None = None,
  entropy: jax.Array | None = None,
  logits: jax.Array | None = None,
  rewards: jax.Array | None = None,
  reward_valid: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Clipped-surrogate policy loss (to minimise) and metrics.

  Args:
    logprobs: float [N, T], log pi(token) under the policy being trained (differentiated).
    old_logprobs: float [N, T], under the policy that sampled the rollouts.
    advantages: float [N], one per sequence.
    completion_mask: bool or float [N, T]; 1 on generated tokens.
    config: `PolicyLossConfig`.
    ref_logprobs: float [N, T] under the frozen reference policy; needed when config.kl_coef > 0.
    sample_valid: bool [N]; False drops the sequence (failed reward judgment) from loss and metrics.
    entropy: float [N, T] per-token entropy, or logits: float [N, T, V] to compute it from.
    rewards, reward_valid: float [N, R] and bool [N, R], only for the per-reward mean metric.
  Returns:
    (loss scalar, metrics). Token metrics are means over the unmasked tokens of valid sequences:
    clip_frac (tokens whose clipped term is active), clip_frac_low / clip_frac_high (ratio below /
    above the clip range on the side that binds), dual_clip_frac, approx_kl (k3 estimate of
    KL(pi_old || pi), nats), ratio_mean, pg_loss, and when available kl, entropy, reward_mean [R].
  """
  chex.assert_rank([logprobs, old_logprobs, completion_mask, advantages], [2, 2, 2, 1])
  chex.assert_equal_shape([logprobs, old_logprobs, completion_mask])
  chex.assert_type([logprobs, old_logprobs, advantages], [float, float, float])
  chex.assert_axis_dimension(advantages, 0, logprobs.shape[0])
  dtype = jnp.promote_types(logprobs.dtype, jnp.float32)
  logprobs = logprobs.astype(dtype)
  old_logprobs = old_logprobs.astype(dtype)
  adv = advantages.astype(dtype)[:, None]
  mask = completion_mask.astype(dtype)
  if sample_valid is not None:
    chex.assert_shape(sample_valid, advantages.shape)
    chex.assert_type(sample_valid, bool)
    mask = mask * sample_valid[:, None].astype(dtype)

  log_ratio = jnp.clip(logprobs - old_logprobs, -config.log_ratio_clamp, config.log_ratio_clamp)
  ratio = jnp.exp(log_ratio)
  unclipped = -adv * ratio
  clipped = -adv * jnp.clip(ratio, 1.0 - config.eps_low, 1.0 + config.eps_high)
  token_loss = jnp.maximum(unclipped, clipped)
  dual_clipped = jnp.zeros_like(token_loss, dtype=bool)
  if config.dual_clip_c is not None:
    cap = -adv * config.dual_clip_c
    dual_clipped = (adv < 0) & (cap < token_loss)
    token_loss = jnp.where(adv < 0, jnp.minimum(token_loss, cap), token_loss)
  pg_loss = aggregate_loss(token_loss, mask, config.aggregation, config.max_gen_len)
  loss = pg_loss

  sg = jax.lax.stop_gradient
  metrics = {
    "pg_loss": sg(pg_loss),
    "clip_frac": _masked_mean((clipped > unclipped).astype(dtype), mask),
    "clip_frac_low": _masked_mean(((adv < 0) & (ratio < 1.0 - config.eps_low)).astype(dtype), mask),
    "clip_frac_high": _masked_mean(((adv > 0) & (ratio > 1.0 + config.eps_high)).astype(dtype), mask),
    "dual_clip_frac": _masked_mean(dual_clipped.astype(dtype), mask),
    "approx_kl": _masked_mean(sg(jnp.expm1(log_ratio) - log_ratio), mask),
    "ratio_mean": _masked_mean(sg(ratio), mask),
    "num_tokens": jnp.sum(mask),
  }

  if ref_logprobs is not None:
    chex.assert_equal_shape([logprobs, ref_logprobs])
    kl = kl_penalty(logprobs, ref_logprobs.astype(dtype), config.kl_estimator, config.log_ratio_clamp)
    kl_loss = aggregate_loss(kl, mask, config.aggregation, config.max_gen_len)
    loss = loss + config.kl_coef * kl_loss
    metrics["kl"] = sg(_masked_mean(kl, mask))
  elif config.kl_coef > 0:
    raise ValueError("config.kl_coef > 0 needs ref_logprobs")

  if entropy is None and logits is not None:
    chex.assert_rank(logits, 3)
    chex.assert_equal_shape_prefix([logits, logprobs], 2)
    entropy = entropy_from_logits(logits)
  if entropy is not None:
    chex.assert_equal_shape([entropy, logprobs])
    entropy = entropy.astype(dtype)
    if config.entropy_coef:
      loss = loss - config.entropy_coef * aggregate_loss(entropy, mask, config.aggregation, config.max_gen_len)
    metrics["entropy"] = sg(_masked_mean(entropy, mask))
  elif config.entropy_coef:
    raise ValueError("config.entropy_coef needs entropy or logits")

  if rewards is not None:
    chex.assert_rank(rewards, 2)
    chex.assert_axis_dimension(rewards, 0, logprobs.shape[0])
    keep = jnp.ones(rewards.shape, bool) if reward_valid is None else reward_valid
    chex.assert_equal_shape([rewards, keep])
    if sample_valid is not None:
      keep = keep & sample_valid[:, None]
    count = jnp.maximum(jnp.sum(keep, axis=0).astype(dtype), 1.0)
    metrics["reward_mean"] = jnp.sum(jnp.where(keep, rewards.astype(dtype), 0.0), axis=0) / count

  metrics = {k: sg(v) for k, v in metrics.items()}
  return loss, metrics
