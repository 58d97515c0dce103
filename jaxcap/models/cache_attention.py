"""GQA attention of queries over keys and values in the KV cache's layout (keys [B, K, H, S], values [B, K, S, H]),
optionally with a prefix shared by groups of rows: the decode steps' attention, and the blocked attention of packed
rows (`segment_attention`), where XLA:CPU runs this layout faster than `jax.nn.dot_product_attention`'s.

Shapes: B batch, T queries, S key slots, N query heads, K key/value heads, H head dim.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def cached_attention(
  q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float, prefix: tuple | None = None
) -> jax.Array:
  """GQA attention of q [B, T, N, H] over a cache's keys [B, K, H, S] and values [B, K, S, H] -> [B, T, N, H].

  prefix: optional (keys [P, K, H, S0], values [P, K, S0, H]) shared by B / P consecutive rows each, slots before
  the rows' own (`KVCache`); mask bool [B, 1, T, S0 + S] then covers both. The math of
  `jax.nn.dot_product_attention`'s XLA path (float32 scores and softmax, masked scores set to -0.7 x the float32
  max, probabilities cast back to the inputs' dtype), on the cache's layout; with a prefix, one softmax over the
  prefix's and the row's own scores, and the output the sum of the two parts' products."""
  b, t, n, h = q.shape
  kv_heads = k.shape[1]
  g = n // kv_heads
  # batch dims (B, K) leading in both operands and the caches used as they lie (a reshape of an updated cache made
  # XLA duplicate its in-place update into copies); XLA:CPU has a bf16 x bf16 -> f32 dot only in this form
  q = q.reshape(b, t, kv_heads, g, h).transpose(0, 2, 1, 3, 4).reshape(b, kv_heads, t * g, h)
  v = v.astype(q.dtype)
  scores = _scores(q, k)
  if prefix is not None:
    # the prompt's rows ask its shared keys together: [P, K, (B / P) * T * G, H], one dot per prompt and head
    pk, pv = prefix
    p, reps = pk.shape[0], b // pk.shape[0]
    qp = q.reshape(p, reps, kv_heads, t * g, h).transpose(0, 2, 1, 3, 4).reshape(p, kv_heads, reps * t * g, h)
    sp = _scores(qp, pk).reshape(p, kv_heads, reps, t * g, -1).transpose(0, 2, 1, 3, 4).reshape(b, kv_heads, t * g, -1)
    scores = jnp.concatenate([sp, scores], axis=-1)
  s = scores.shape[-1]
  scores = scores.reshape(b, kv_heads, t, g, s) * jnp.float32(scale)
  scores = jnp.where(mask[:, :, :, None], scores, -0.7 * float(jnp.finfo(jnp.float32).max))
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype).reshape(b, kv_heads, t * g, s)
  if prefix is None:
    out = jnp.einsum("bkqs,bksh->bkqh", probs, v)
  else:
    s0 = pv.shape[2]
    pp = probs[..., :s0].reshape(p, reps, kv_heads, t * g, s0).transpose(0, 2, 1, 3, 4)
    shared = jnp.einsum("pkqs,pksh->pkqh", pp.reshape(p, kv_heads, reps * t * g, s0), pv.astype(v.dtype))
    shared = shared.reshape(p, kv_heads, reps, t * g, h).transpose(0, 2, 1, 3, 4).reshape(b, kv_heads, t * g, h)
    out = shared + jnp.einsum("bkqs,bksh->bkqh", probs[..., s0:], v)
  out = out.reshape(b, kv_heads, t, g, h)
  return out.transpose(0, 2, 1, 3, 4).reshape(b, t, n, h)


def _scores(q: jax.Array, k: jax.Array) -> jax.Array:
  """q [B, K, Q, H] . keys [B, K, H, S] -> float32 scores [B, K, Q, S]."""
  k = k.astype(q.dtype)
  precision = jax.lax.DotAlgorithmPreset.BF16_BF16_F32 if q.dtype == jnp.bfloat16 else None
  return jnp.einsum("bkqh,bkhs->bkqs", q, k, precision=precision, preferred_element_type=jnp.float32)
