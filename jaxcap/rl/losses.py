"""The policy loss: a registered surrogate (`POLICY_LOSSES`, default PPO clip with clip-higher and dual clip),
aggregated, plus KL to a reference policy and an entropy bonus.

Shapes: N sequences (B * G rollouts flattened), T completion tokens. Log-probs are natural-log
probabilities of the sampled tokens, float [N, T]; advantages are per sequence, float [N], broadcast over
its tokens; completion_mask is [N, T] (1 / True on generated tokens, 0 on prompt and padding).
"""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp

from jaxcap.rl.aggregation import LOSS_AGGREGATIONS, aggregate_loss, masked_mean
from jaxcap.rl.kl import KL_ESTIMATORS, entropy_from_logits, kl_penalty
from jaxcap.rl.policy_losses import POLICY_LOSSES, SurrogateInputs

__all__ = [
  "KL_ESTIMATORS", "LOSS_AGGREGATIONS", "POLICY_LOSSES", "PolicyLossConfig", "aggregate_loss", "entropy_from_logits",
  "kl_penalty", "policy_loss",
]  # fmt: skip


@dataclasses.dataclass(frozen=True)
class PolicyLossConfig:
  """Hyper-parameters of `policy_loss`; frozen and hashable, so it can be a static jit argument.

  policy: the surrogate, a `POLICY_LOSSES` name (ppo, gspo, gspo_token, cispo, sapo, gpg, clip_cov, kl_cov,
    geo_mean; jaxcap.rl.policy_losses).
  eps_low, eps_high: the ratio is clipped to [1 - eps_low, 1 + eps_high]; eps_high > eps_low is
    "clip-higher" (DAPO uses 0.28), which leaves room to raise unlikely tokens. Also the ranges of gspo, cispo,
    clip_cov and (in log space) geo_mean.
  dual_clip_c: for negative advantages the token loss is capped at -A * c (c = 3), so a huge ratio on a
    bad token cannot blow up the update; None disables it (ppo only).
  log_ratio_clamp: log(pi / pi_old) and log(pi_ref / pi) are clamped to [-v, v] before exp.
  aggregation: how token losses become one scalar, see `aggregate_loss`; gspo, gspo_token, sapo and geo_mean fix
    their own (`loss_aggregation`).
  max_gen_len: the Dr.GRPO constant for "seq-mean-token-sum-norm" (the maximum generation length,
    in tokens); None uses T of the batch, which is only constant if batches are padded to that length.
  kl_coef, kl_estimator: weight and estimator ("k1", "k2", "k3") of the per-token KL to the reference
    policy; 0 disables it (BalCapRL, released CapRL).
  entropy_coef: weight of an entropy bonus (subtracted from the loss); needs `entropy` or `logits`.
  tau_pos, tau_neg: SAPO's gate temperatures for positive / non-positive advantages (verl: 1.0, 1.05).
  clip_cov_ratio, clip_cov_lb, clip_cov_ub: Clip-Cov's share of tokens cut and its covariance band (verl: 2e-4,
    1, 5).
  kl_cov_ratio, kl_cov_coef: KL-Cov's share of tokens penalised and the penalty's weight (verl: 2e-4 and its
    ppo_kl_coef, 0.1).
  """

  eps_low: float = 0.2
  eps_high: float = 0.28
  dual_clip_c: float | None = 3.0
  log_ratio_clamp: float = 20.0
  aggregation: str = "token-mean"
  max_gen_len: int | None = None
  kl_coef: float = 0.05
  kl_estimator: str = "k3"
  entropy_coef: float = 0.0
  policy: str = "ppo"
  tau_pos: float = 1.0
  tau_neg: float = 1.05
  clip_cov_ratio: float = 2e-4
  clip_cov_lb: float = 1.0
  clip_cov_ub: float = 5.0
  kl_cov_ratio: float = 2e-4
  kl_cov_coef: float = 0.1

  def __post_init__(self):
    if self.eps_low < 0 or self.eps_high < 0 or self.eps_low >= 1:
      raise ValueError(f"need 0 <= eps_low < 1 and eps_high >= 0, got {self.eps_low}, {self.eps_high}")
    if self.dual_clip_c is not None and self.dual_clip_c <= 1.0:
      raise ValueError(f"dual_clip_c must exceed 1, got {self.dual_clip_c}")
    LOSS_AGGREGATIONS[self.aggregation]  # raises, naming the known ones
    KL_ESTIMATORS[self.kl_estimator]
    POLICY_LOSSES[self.policy]
    if self.max_gen_len is not None and self.max_gen_len <= 0:
      raise ValueError(f"max_gen_len must be positive, got {self.max_gen_len}")
    if self.tau_pos <= 0 or self.tau_neg <= 0:
      raise ValueError(f"SAPO's tau_pos and tau_neg must be positive, got {self.tau_pos}, {self.tau_neg}")
    if not 0 < self.clip_cov_ratio <= 1 or not 0 < self.kl_cov_ratio <= 1:
      raise ValueError(
        f"clip_cov_ratio, kl_cov_ratio must be in (0, 1], got {self.clip_cov_ratio}, {self.kl_cov_ratio}"
      )
    if not self.clip_cov_lb < self.clip_cov_ub:
      raise ValueError(f"need clip_cov_lb < clip_cov_ub, got {self.clip_cov_lb}, {self.clip_cov_ub}")
    if self.kl_cov_coef < 0:
      raise ValueError(f"kl_cov_coef must be >= 0, got {self.kl_cov_coef}")

  @property
  def loss_aggregation(self) -> str:
    """The aggregation actually used: the policy's own where it fixes one, else `aggregation`."""
    return POLICY_LOSSES[self.policy].aggregation or self.aggregation


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
  is_weights: jax.Array | None = None,
  key: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """The policy loss (to minimise) and metrics: the surrogate `config.policy`, aggregated, plus the KL and entropy
  terms (aggregated the same way: `config.loss_aggregation`; verl aggregates its KL term with loss_agg_mode even
  where gspo / sapo fix their own).

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
    is_weights: float [N, T], rollout-correction importance weights (jaxcap.rl.rollout_correction), detached;
      they multiply the surrogate's token loss (not the KL or entropy terms, as verl).
    key: a PRNG key, for surrogates that draw (clip_cov); None makes them deterministic.
  Returns:
    (loss scalar, metrics). Token metrics are means over the unmasked tokens of valid sequences: the
    surrogate's own (ppo: clip_frac, clip_frac_low, clip_frac_high, dual_clip_frac; see each in
    jaxcap.rl.policy_losses), approx_kl (k3 estimate of
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

  agg = config.loss_aggregation
  log_ratio = jnp.clip(logprobs - old_logprobs, -config.log_ratio_clamp, config.log_ratio_clamp)
  ratio = jnp.exp(log_ratio)
  if is_weights is not None:
    chex.assert_equal_shape([logprobs, is_weights])
    is_weights = jax.lax.stop_gradient(is_weights.astype(dtype))
  surrogate = POLICY_LOSSES[config.policy].fn(
    SurrogateInputs(logprobs, old_logprobs, log_ratio, ratio, adv, mask, config, is_weights, key)
  )
  pg_loss = aggregate_loss(surrogate.token_loss, mask, agg, config.max_gen_len)
  loss = pg_loss

  sg = jax.lax.stop_gradient
  metrics = {
    "pg_loss": sg(pg_loss),
    **surrogate.metrics,
    "approx_kl": masked_mean(sg(jnp.expm1(log_ratio) - log_ratio), mask),
    "ratio_mean": masked_mean(sg(ratio), mask),
    "num_tokens": jnp.sum(mask),
  }

  if ref_logprobs is not None:
    chex.assert_equal_shape([logprobs, ref_logprobs])
    kl = kl_penalty(logprobs, ref_logprobs.astype(dtype), config.kl_estimator, config.log_ratio_clamp)
    kl_loss = aggregate_loss(kl, mask, agg, config.max_gen_len)
    loss = loss + config.kl_coef * kl_loss
    metrics["kl"] = sg(masked_mean(kl, mask))
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
      loss = loss - config.entropy_coef * aggregate_loss(entropy, mask, agg, config.max_gen_len)
    metrics["entropy"] = sg(masked_mean(entropy, mask))
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
