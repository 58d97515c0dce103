"""Attention of a group's completions over their shared prompt and themselves: the training passes' prompt-shared
attention (`Qwen25VL.decode_shared`), where each prompt's keys and values are computed once for its G completions.

Completion row r (of N = B * G; rows b*G .. b*G+G-1 belong to prompt b) at position i reads its prompt's real tokens
and its own positions 0..i: the attention the repeated rows [prompt | completion] compute at their completion
positions, without the G copies of the prompt. On TPU, splash attention over one row per prompt (the G completions'
queries against [prompt | G completions] keys, a static block-diagonal-causal mask that skips the other completions'
key blocks, segment ids for the prompt's padding); elsewhere `cached_attention`'s shared-prefix path (the math of
`jax.nn.dot_product_attention`'s XLA path: float32 scores and softmax, each prompt's keys read by its G rows in one
dot).

Shapes: B prompts, P prompt slots, N completions, C completion slots, NH query heads, K key/value heads, H head dim.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxcap.models import splash
from jaxcap.models.cache_attention import cached_attention


def group_attention(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  prompt_k: jax.Array,
  prompt_v: jax.Array,
  prompt_mask: jax.Array,
  scale: float,
) -> jax.Array:
  """q [N, C, NH, H] and k, v [N, C, K, H] of the completions, prompt_k, prompt_v [B, P, K, H] of their prompts,
  prompt_mask bool [B, P] (real prompt tokens) -> [N, C, NH, H]: each completion position attends to its prompt's
  real tokens and causally to its own completion."""
  if splash.applies():
    return splash.group_attention(q, k, v, prompt_k, prompt_v, prompt_mask, scale)
  n, c = q.shape[:2]
  b, p = prompt_mask.shape
  g = n // b
  own = jnp.broadcast_to(jnp.tril(jnp.ones((c, c), bool)), (n, 1, c, c))
  shared = jnp.broadcast_to(jnp.repeat(prompt_mask.astype(bool), g, axis=0)[:, None, None, :], (n, 1, c, p))
  as_keys = lambda x: x.transpose(0, 2, 3, 1)  # [rows, K, H, slots]: the cache's key layout
  as_values = lambda x: x.transpose(0, 2, 1, 3)  # [rows, K, slots, H]
  prefix = (as_keys(prompt_k), as_values(prompt_v))
  return cached_attention(q, as_keys(k), as_values(v), jnp.concatenate([shared, own], -1), scale, prefix=prefix)
