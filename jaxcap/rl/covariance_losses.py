"""The covariance-based policy losses of Cui et al. 2025 ("The Entropy Mechanism of RL for Reasoning LMs",
arXiv:2505.22617): Clip-Cov and KL-Cov, registered in `jaxcap.rl.POLICY_LOSSES` (conventions in
`jaxcap.rl.policy_losses`). Both pick a small share of tokens by the centred covariance of advantage and log-prob
and restrain only those."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxcap.rl.aggregation import masked_mean
from jaxcap.rl.policy_losses import Surrogate, SurrogateInputs, _weighted, register_policy_loss

sg = jax.lax.stop_gradient


@register_policy_loss("clip_cov", uses_key=True)
def clip_cov(x: SurrogateInputs) -> Surrogate:
  """Clip-Cov (Cui et al. 2025, arXiv:2505.22617): the PPO clip objective (no dual clip), plus the gradient of a
  random clip_cov_ratio share of the tokens cut: those not already clipped whose centred covariance
  cov = (A - mean A) (log pi - mean sg[log pi]) lies in (clip_cov_lb, clip_cov_ub); l = max(-A r, -A clip(r)) * corr,
  corr = 0 on the chosen tokens. The count is max(floor(clip_cov_ratio * tokens), 1) over this micro-batch's tokens.

  Differences from verl: r = exp(log pi - log pi_old) is unclamped as in verl, but the random choice draws from the
  micro-batch's JAX key (a uniform priority per candidate, the lowest ones chosen) instead of torch.randperm; with
  no key the first candidates in row-major order are chosen. With no more candidates than the count, both choose
  every candidate (the equality test). Metric: clip_frac (the share of tokens cut).
  """
  c, adv, mask = x.config, x.adv, x.mask
  ratio = jnp.exp(x.logprobs - x.old_logprobs)
  unclipped = -adv * ratio
  clipped = -adv * jnp.clip(ratio, 1.0 - c.eps_low, 1.0 + c.eps_high)
  by_origin = (clipped > unclipped) & (mask > 0)
  mean_adv = jnp.sum(adv * mask) / (jnp.sum(mask) + 1e-8)  # verl_F.masked_mean, its 1e-8
  mean_lp = jnp.sum(sg(x.logprobs) * mask) / (jnp.sum(mask) + 1e-8)
  cov = (adv - mean_adv) * (x.logprobs - mean_lp)
  candidate = (cov < c.clip_cov_ub) & (cov > c.clip_cov_lb) & (mask > 0) & ~by_origin
  count = jnp.maximum(jnp.floor(c.clip_cov_ratio * jnp.sum(mask)), 1.0)
  if x.key is None:
    priority = jnp.arange(mask.size, dtype=jnp.float32).reshape(mask.shape)
  else:
    priority = jax.random.uniform(x.key, mask.shape)
  chosen = candidate & (_rank(jnp.where(candidate, priority, jnp.inf)) < count)
  corr = jnp.where(chosen, 0.0, 1.0).astype(ratio.dtype)
  token_loss = jnp.maximum(unclipped, clipped) * corr
  return Surrogate(_weighted(token_loss, x), {"clip_frac": masked_mean(chosen.astype(ratio.dtype), mask)})


def _rank(values):
  """Rank of each entry of `values` in ascending order over all entries (0 = smallest; ties by position)."""
  flat = values.reshape(-1)
  order = jnp.argsort(flat, stable=True)
  return jnp.zeros(flat.shape, jnp.int32).at[order].set(jnp.arange(flat.size, dtype=jnp.int32)).reshape(values.shape)


@register_policy_loss("kl_cov")
def kl_cov(x: SurrogateInputs) -> Surrogate:
  """KL-Cov (Cui et al. 2025, arXiv:2505.22617): the unclipped surrogate l = -A r, plus kl_cov_coef |log r| on the
  max(1, floor(kl_cov_ratio * tokens)) tokens of largest covariance (A - mean A)(log pi - mean log pi) (means over
  this micro-batch's unmasked tokens, detached). r = exp(log pi - log pi_old), unclamped as in verl. Equal to verl's
  `kl_cov` (ties broken by position, torch.topk's order is unspecified). Metrics: kl_cov_abs_kl (mean |log r|),
  clip_frac (the share of tokens penalised)."""
  c, adv, mask = x.config, x.adv, x.mask
  d = x.logprobs - x.old_logprobs
  ratio = jnp.exp(d)
  abs_kl = jnp.abs(d)
  valid = mask > 0
  n = jnp.sum(mask)
  mean_adv = jnp.sum(jnp.where(valid, adv, 0.0)) / jnp.maximum(n, 1.0)
  lp = sg(x.logprobs)
  mean_lp = jnp.sum(jnp.where(valid, lp, 0.0)) / jnp.maximum(n, 1.0)
  cov = (adv - mean_adv) * (lp - mean_lp)
  count = jnp.maximum(jnp.floor(n * c.kl_cov_ratio), 1.0)
  chosen = valid & (_rank(jnp.where(valid, -cov, jnp.inf)) < count)
  token_loss = -adv * ratio + jnp.where(chosen, c.kl_cov_coef * abs_kl, 0.0)
  metrics = {"kl_cov_abs_kl": masked_mean(abs_kl, mask), "clip_frac": masked_mean(chosen.astype(d.dtype), mask)}
  return Surrogate(_weighted(token_loss, x), metrics)
