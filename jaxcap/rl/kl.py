"""Per-token KL to a reference policy (`KL_ESTIMATORS`: k1, k2, k3) and the entropy of next-token distributions."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from jaxcap.registry import Registry

# name -> estimate(d [N, T]) -> per-token KL [N, T], with d = log pi_ref - log pi; see `kl_penalty`
KL_ESTIMATORS: Registry[Callable[[jax.Array], jax.Array]] = Registry("KL estimator", field="rl.loss.kl_estimator")


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
