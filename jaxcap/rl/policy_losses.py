"""The policy-gradient surrogates (`POLICY_LOSSES`, chosen by `rl.loss.policy`): per-token losses before aggregation.

Each entry is a pure function of a `SurrogateInputs` (log-probs, old log-probs, advantages, mask, config) returning
a `Surrogate` (per-token loss [N, T] and metrics). `jaxcap.rl.losses.policy_loss` aggregates it and adds the KL and
entropy terms. Formulas follow verl's `verl/trainer/ppo/core_algos.py` (`compute_policy_loss_<name>`); every
difference is listed in the entry's docstring. Shared conventions, all losses:
- advantages are one per sequence ([N], broadcast over tokens), so verl's token-level `advantages` tensor is the
  broadcast A_i; the `mask` is the completion mask times sample validity (and rollout rejection).
- `is_weights` (rollout correction, `jaxcap.rl.rollout_correction`) multiply the token loss as in verl
  (`pg_losses * rollout_is_weights`), except where an entry says otherwise.
- clip_cov and kl_cov (covariance-selected tokens) live in `jaxcap.rl.covariance_losses`.
- a loss with a fixed aggregation in verl (gspo, gspo_token, sapo: seq-mean-token-mean; geo_mean: a mean over
  sequences) declares it (`PolicyLoss.aggregation`) and ignores `rl.loss.aggregation`.

Adding one (see docs/extending.md):

    @register_policy_loss("my_loss")
    def my_loss(x: SurrogateInputs) -> Surrogate:
      return Surrogate(-x.adv * x.ratio * _weights(x), {})
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from jaxcap.registry import Registry
from jaxcap.rl.aggregation import masked_mean

sg = jax.lax.stop_gradient


class SurrogateInputs(NamedTuple):
  """What every surrogate sees. logprobs, old_logprobs float [N, T]; log_ratio = clip(logprobs - old_logprobs,
  -config.log_ratio_clamp, config.log_ratio_clamp) and ratio = exp(log_ratio), [N, T]; adv float [N, 1]; mask
  float [N, T] (0/1); config a `PolicyLossConfig`; is_weights float [N, T] or None; key a PRNG key or None."""

  logprobs: jax.Array
  old_logprobs: jax.Array
  log_ratio: jax.Array
  ratio: jax.Array
  adv: jax.Array
  mask: jax.Array
  config: Any
  is_weights: jax.Array | None = None
  key: jax.Array | None = None


class Surrogate(NamedTuple):
  token_loss: jax.Array  # float [N, T], to be aggregated over the mask
  metrics: dict[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class PolicyLoss:
  """A registered surrogate: `fn(SurrogateInputs) -> Surrogate`; `aggregation` fixed by the method (None: the
  config's); `uses_key`: draws random numbers (needs a PRNG key per micro-batch)."""

  fn: Callable[[SurrogateInputs], Surrogate]
  aggregation: str | None = None
  uses_key: bool = False


POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss", field="rl.loss.policy")


def register_policy_loss(name: str, *, aggregation: str | None = None, uses_key: bool = False):
  """Decorator: register `fn(SurrogateInputs) -> Surrogate` under `name`."""

  def add(fn):
    POLICY_LOSSES.register(name, PolicyLoss(fn, aggregation, uses_key))
    return fn

  return add


def _weighted(token_loss, x: SurrogateInputs):
  return token_loss if x.is_weights is None else token_loss * x.is_weights


@register_policy_loss("ppo")
def ppo(x: SurrogateInputs) -> Surrogate:
  """PPO clip (Schulman 2017) with clip-higher (DAPO) and dual clip (Ye 2020): verl's `vanilla`.

  l = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)); for A < 0, l = min(l, -A c) (c = dual_clip_c; None: off).
  r = exp(clip(log pi - log pi_old, -20, 20)) (log_ratio_clamp). Same as verl except that dual clip can be off.
  Metrics: clip_frac (the clipped term binds), clip_frac_low / clip_frac_high (ratio below / above the range on the
  side that binds), dual_clip_frac.
  """
  c, adv, ratio, mask = x.config, x.adv, x.ratio, x.mask
  unclipped = -adv * ratio
  clipped = -adv * jnp.clip(ratio, 1.0 - c.eps_low, 1.0 + c.eps_high)
  token_loss = jnp.maximum(unclipped, clipped)
  dual_clipped = jnp.zeros_like(token_loss, dtype=bool)
  if c.dual_clip_c is not None:
    cap = -adv * c.dual_clip_c
    dual_clipped = (adv < 0) & (cap < token_loss)
    token_loss = jnp.where(adv < 0, jnp.minimum(token_loss, cap), token_loss)
  dtype = token_loss.dtype
  metrics = {
    "clip_frac": masked_mean((clipped > unclipped).astype(dtype), mask),
    "clip_frac_low": masked_mean(((adv < 0) & (ratio < 1.0 - c.eps_low)).astype(dtype), mask),
    "clip_frac_high": masked_mean(((adv > 0) & (ratio > 1.0 + c.eps_high)).astype(dtype), mask),
    "dual_clip_frac": masked_mean(dual_clipped.astype(dtype), mask),
  }
  return Surrogate(_weighted(token_loss, x), metrics)


def _gspo_seq_log_ratio(x: SurrogateInputs):
  """mean_t (log pi - log pi_old) per sequence [N, 1] (unclamped; verl clamps after adding, at 10 above)."""
  d = x.logprobs - x.old_logprobs
  return jnp.sum(d * x.mask, axis=-1, keepdims=True) / jnp.maximum(jnp.sum(x.mask, axis=-1, keepdims=True), 1.0)


def _clipped_objective(adv, ratio, config, mask):
  unclipped = -adv * ratio
  clipped = -adv * jnp.clip(ratio, 1.0 - config.eps_low, 1.0 + config.eps_high)
  return jnp.maximum(unclipped, clipped), {"clip_frac": masked_mean((clipped > unclipped).astype(ratio.dtype), mask)}


@register_policy_loss("gspo", aggregation="seq-mean-token-mean")
def gspo(x: SurrogateInputs) -> Surrogate:
  """GSPO (Zheng et al. 2025, arXiv:2507.18071), sequence form: s_i = exp(min(mean_t log(pi / pi_old), 10)),
  l_i = max(-A_i s_i, -A_i clip(s_i, 1 - eps_low, 1 + eps_high)), the same l_i on every token of sequence i,
  aggregated seq-mean-token-mean (mean_i l_i). The paper's ranges are eps_low = 3e-4, eps_high = 4e-4.

  verl implements the token form (`gspo_token`); with one advantage per sequence (always, here) the two have the
  same value and the same gradient (grad s_i = s_i mean_t grad log pi_t), except with token-level IS weights w_t:
  the value is still the same (mean_t w_t l_i) but here each token's gradient is s_i mean_t(w_t) / |y_i| instead of
  s_i w_t / |y_i| (use gspo_token, or sequence-level weights, to weight tokens). The sequence length is max(|y_i|, 1) as
  verl's clamp(min=1). Metric: clip_frac (the clipped term binds, per token of the sequence).
  """
  s = jnp.exp(jnp.minimum(_gspo_seq_log_ratio(x), 10.0))
  s = jnp.broadcast_to(s, x.logprobs.shape)
  token_loss, metrics = _clipped_objective(x.adv, s, x.config, x.mask)
  return Surrogate(_weighted(token_loss, x), metrics)


@register_policy_loss("gspo_token", aggregation="seq-mean-token-mean")
def gspo_token(x: SurrogateInputs) -> Surrogate:
  """GSPO-token (arXiv:2507.18071, eq. 13), verl's `gspo`: s_it = sg[s_i] pi_t / sg[pi_t] (value s_i, gradient
  s_i grad log pi_t), log s_it clamped at 10 above; l_it = max(-A s_it, -A clip(s_it, 1 - eps_low, 1 + eps_high)),
  seq-mean-token-mean. Equal to verl's formula as written."""
  log_s = x.logprobs - sg(x.logprobs) + sg(_gspo_seq_log_ratio(x))
  s = jnp.exp(jnp.minimum(log_s, 10.0))
  token_loss, metrics = _clipped_objective(x.adv, s, x.config, x.mask)
  return Surrogate(_weighted(token_loss, x), metrics)


@register_policy_loss("cispo")
def cispo(x: SurrogateInputs) -> Surrogate:
  """CISPO (MiniMax-M1, arXiv:2506.13585): l = -sg[clip(r, 1 - eps_low, 1 + eps_high)] A log pi, so every token
  keeps a gradient (the clipped IS weight only scales it). r as in `ppo` (clamped log-ratio). Equal to verl's
  `cispo`; the loss value is -w A log pi, not comparable to ppo's. Metric: clip_frac (r outside the range)."""
  c = x.config
  clipped = sg(jnp.clip(x.ratio, 1.0 - c.eps_low, 1.0 + c.eps_high))
  token_loss = -clipped * x.adv * x.logprobs
  metrics = {"clip_frac": masked_mean((x.ratio != clipped).astype(x.ratio.dtype), x.mask)}
  return Surrogate(_weighted(token_loss, x), metrics)


@register_policy_loss("sapo", aggregation="seq-mean-token-mean")
def sapo(x: SurrogateInputs) -> Surrogate:
  """SAPO (Qwen, arXiv:2511.20347): a smooth gate instead of a hard clip, l = -f(r) A with
  f(r) = sigmoid(tau (r - 1)) 4 / tau, tau = tau_pos where A > 0 else tau_neg; seq-mean-token-mean.
  r as in `ppo`. Equal to verl's `sapo`. No metrics of its own (verl reports clip fractions of 0)."""
  c = x.config
  tau = jnp.where(x.adv > 0, c.tau_pos, c.tau_neg).astype(x.ratio.dtype)
  gates = jax.nn.sigmoid(tau * (x.ratio - 1.0)) * (4.0 / tau)
  return Surrogate(_weighted(-gates * x.adv, x), {})


@register_policy_loss("gpg")
def gpg(x: SurrogateInputs) -> Surrogate:
  """GPG (Chu et al. 2025, arXiv:2504.02546): plain policy gradient l = -A log pi, no ratio and no clip (pair with
  the `gpg` estimator). Equal to verl's `gpg`."""
  return Surrogate(_weighted(-x.logprobs * x.adv, x), {})


@register_policy_loss("geo_mean", aggregation="seq-mean-token-mean")
def geo_mean(x: SurrogateInputs) -> Surrogate:
  """GMPO (Zhao et al. 2025, arXiv:2507.20673): a geometric mean of token ratios clipped in log space,
  s_i = exp(sum_t m sgn(A) min(sgn(A) d_t, sgn(A) clip(d_t, -eps_low, eps_high)) / (|y_i| + 1e-8)),
  d = log pi - log pi_old (unclamped), l_i = -A_i s_i. GMPO's ranges are wider (e.g. eps = 0.4).

  Differences from verl's `geo_mean`: l_i is placed on every token of sequence i and aggregated
  seq-mean-token-mean, so the mean runs over sequences with a token; verl's torch.mean counts fully masked rows
  too (their l_i is 0). IS weights enter as verl's: one per sequence, their geometric mean
  exp(sum_t m log(w + 1e-10) / (|y_i| + 1e-8)). Metrics: clip_frac / clip_frac_low (d clamped, A > 0 / A < 0).
  """
  c, adv, mask = x.config, x.adv, x.mask
  d = x.logprobs - x.old_logprobs
  sgn = jnp.sign(adv)
  d_clamp = jnp.clip(d, -c.eps_low, c.eps_high)
  d_min = sgn * jnp.minimum(sgn * d, sgn * d_clamp)
  n = jnp.sum(mask, axis=-1, keepdims=True)
  ratio = jnp.exp(jnp.sum(d_min * mask, axis=-1, keepdims=True) / (n + 1e-8))
  seq_adv = jnp.sum(adv * mask, axis=-1, keepdims=True) / (n + 1e-8)
  seq_loss = -seq_adv * ratio
  if x.is_weights is not None:
    seq_loss = seq_loss * jnp.exp(jnp.sum(jnp.log(x.is_weights + 1e-10) * mask, axis=-1, keepdims=True) / (n + 1e-8))
  clipped = d != d_clamp
  metrics = {
    "clip_frac": masked_mean((clipped & (adv > 0)).astype(d.dtype), mask),
    "clip_frac_low": masked_mean((clipped & (adv < 0)).astype(d.dtype), mask),
  }
  return Surrogate(jnp.broadcast_to(seq_loss, d.shape), metrics)
