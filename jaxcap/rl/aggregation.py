"""Loss aggregation: how per-token losses [N, T] and a 0/1 mask become one scalar (`LOSS_AGGREGATIONS`)."""

from __future__ import annotations

from typing import Callable

import chex
import jax
import jax.numpy as jnp

from jaxcap.registry import Registry

# name -> aggregate(seq_sum [N], seq_tokens [N], length) -> scalar; see `aggregate_loss`
LOSS_AGGREGATIONS: Registry[Callable[..., jax.Array]] = Registry("loss aggregation", field="rl.loss.aggregation")


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
  here it is also divided by the number of sequences, so the scale does not grow with the batch. verl's
  seq-mean-token-mean divides each sequence's sum by (tokens + 1e-8), here by max(tokens, 1).
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


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
  """sum(x m) / max(sum(m), 1): the mean over unmasked entries, 0 (not NaN) when there are none."""
  return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)
