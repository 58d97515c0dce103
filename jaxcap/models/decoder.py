"""The Qwen2 / Qwen3 decoder layer: GQA self-attention with multimodal RoPE, a static-shape KV cache, SwiGLU MLP.

Shapes: B batch, T new tokens, S cache slots, D hidden, N query heads, K key/value heads, H head dim.
Variants are flags of the text config: `qkv_bias` (Qwen2: q/k/v biases; Qwen3: none), `qk_norm` (Qwen3: RMSNorm
of each query / key head before the rotary).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from jaxcap.models.cache_attention import cached_attention
from jaxcap.models.config import Qwen25VLConfig
from jaxcap.models.layers import RMSNorm, SwiGLU, apply_rotary, linear
from jaxcap.models.fused_segments import FusedSegments
from jaxcap.models.group_attention import group_attention
from jaxcap.models.packed_attention import packed_attention
from jaxcap.models.segment_attention import SegmentMask
from jaxcap.sharding import shard


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
  """Per-layer keys [B, K, H, S] and values [B, K, S, H]. Slots are written at `cache_index` by the caller's schedule.

  Keys are kept transposed so a decode step's scores q . k and its output p . v are plain batched matmuls over the
  cache as it lies: with [B, S, K, H] keys XLA:CPU copied (transposed) every layer's whole key cache at every step
  (~0.8 -> 0.36 ms per layer and step at 32 x 160 slots). One buffer per layer (not one stacked [L, ...] array):
  each decode step then updates every layer's buffer in place; a stacked cache costs a copy of the layer's slice
  per layer and step.

  A cache made by `grow` also holds a shared prefix: `prefix_k` [P, K, H, T] / `prefix_v` [P, K, T, H] per layer,
  the T prompt slots of P prompts, each read by G = B / P consecutive rows (row r sees prompt r // G).
  Its slots come first: slot j < T is prefix slot j, slot T + i is the row's own slot i. The G samples of a prompt
  then share one copy of its prompt's keys and values instead of G (memory and, in a decode step, the bytes the
  attention reads: G x fewer for the prompt part)."""

  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]
  prefix_k: tuple[jax.Array, ...] = ()
  prefix_v: tuple[jax.Array, ...] = ()

  @classmethod
  def zeros(cls, cfg: Qwen25VLConfig, batch: int, slots: int, dtype=None) -> "KVCache":
    t = cfg.text
    dtype = dtype or cfg.dtype
    zeros = lambda shape: tuple(shard(jnp.zeros(shape, dtype), CACHE_AXES) for _ in range(t.num_hidden_layers))
    return cls(
      zeros((batch, t.num_key_value_heads, t.head_dim, slots)), zeros((batch, t.num_key_value_heads, slots, t.head_dim))
    )

  @property
  def prefix_slots(self) -> int:
    return self.prefix_v[0].shape[2] if self.prefix_v else 0

  @property
  def slots(self) -> int:
    """All slots a row sees: the shared prefix's, then its own."""
    return self.prefix_slots + self.v[0].shape[2]

  def grow(self, repeats: int, slots: int) -> "KVCache":
    """A cache for `repeats` rows per row of this one (row b -> rows b*repeats ...): this cache's slots become
    their shared prefix (not copied per row), followed by `slots` empty slots of their own."""
    if self.prefix_k:
      raise ValueError("grow() of a cache that already has a shared prefix; grow the prompt's cache once")
    b, kv_heads, head_dim, _ = self.k[0].shape
    rows = b * repeats
    own = lambda shape, dtype: tuple(shard(jnp.zeros(shape, dtype), CACHE_AXES) for _ in self.k)
    return KVCache(
      own((rows, kv_heads, head_dim, slots), self.k[0].dtype),
      own((rows, kv_heads, slots, head_dim), self.v[0].dtype),
      prefix_k=self.k,
      prefix_v=self.v,
    )


CACHE_AXES = ("batch", "kv_heads", None, None)
# the kinds of decoder layer a per-layer caller dispatches on (`Qwen25VL.layer_graphs`): ATTENTION layers are called
# (x, cos, sin, mask, kv, cache_index) -> (x, kv); RECURRENT layers (x, real, state) -> (x, state), a fixed-size
# state per row (Qwen3.5's linear layers, `jaxcap.models.qwen35_layers.LinearLayer`)
ATTENTION, RECURRENT = "attention", "recurrent"


class Attention(nnx.Module):
  """GQA self-attention (q/k/v biases and q/k norms per the text config's `qkv_bias` / `qk_norm`):
  `jax.nn.dot_product_attention` (the fused kernel per backend) without a cache, `segment_attention` for packed
  rows (`packed_attention`: a `SegmentMask`, or `FusedSegments` for splash on TPU / Pallas flash on GPU),
  `cached_attention` over a `KVCache`."""

  def __init__(self, cfg: Qwen25VLConfig, *, rngs):
    t = cfg.text
    self.num_heads, self.num_kv_heads, self.head_dim = t.num_attention_heads, t.num_key_value_heads, t.head_dim
    kw = dict(dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs)
    self.q_proj = linear(t.hidden_size, self.num_heads * self.head_dim, bias=t.qkv_bias, **kw)
    self.k_proj = linear(t.hidden_size, self.num_kv_heads * self.head_dim, bias=t.qkv_bias, **kw)
    self.v_proj = linear(t.hidden_size, self.num_kv_heads * self.head_dim, bias=t.qkv_bias, **kw)
    self.o_proj = linear(self.num_heads * self.head_dim, t.hidden_size, bias=False, **kw)
    self.qk_norm = t.qk_norm
    if t.qk_norm:  # Qwen3: each head's query / key normalised over head_dim before the rotary
      self.q_norm = RMSNorm(self.head_dim, t.rms_norm_eps, param_dtype=cfg.param_dtype)
      self.k_norm = RMSNorm(self.head_dim, t.rms_norm_eps, param_dtype=cfg.param_dtype)

  def project(self, x, cos, sin):
    """x [B, T, D] -> queries [B, T, N, H], keys and values [B, T, K, H], the rotary applied."""
    b, t, _ = x.shape
    q = self.q_proj(x).reshape(b, t, self.num_heads, self.head_dim)
    k = self.k_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim)
    v = self.v_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim)
    if self.qk_norm:
      q, k = self.q_norm(q), self.k_norm(k)
    return shard(apply_rotary(q, cos, sin), ("batch", None, "heads", None)), apply_rotary(k, cos, sin), v

  def heads(self, x, cos, sin):
    """`project`'s queries, keys and values, and the map of the attention output [B, T, N * H] -> [B, T, D] (a
    gated attention's gate is computed with its queries: `jaxcap.models.qwen35_layers.GatedAttention`)."""
    return (*self.project(x, cos, sin), self.o_proj)

  def shared(self, prompts, completions, prompt_rope, completion_rope, prompt_mask, prompt_real):
    """The prompt-shared pass (`jaxcap.models.shared_decode`): prompts [B, P, D] attend causally among themselves
    (`prompt_mask` bool [B, 1, P, P]); completions [N, C, D] (G = N / B per prompt) to their prompt's real tokens
    (`prompt_real` bool [B, P]) and causally to themselves (`group_attention`), reading the prompt's keys and
    values once for all G. `*_rope`: (cos, sin) of each stream. Returns both streams' outputs."""
    b, p, _ = prompts.shape
    n, c, _ = completions.shape
    qp, kp, vp, out_p_map = self.heads(prompts, *prompt_rope)
    qc, kc, vc, out_c_map = self.heads(completions, *completion_rope)
    scale = self.head_dim**-0.5
    kp, vp = kp.astype(qp.dtype), vp.astype(qp.dtype)
    out_p = jax.nn.dot_product_attention(qp, kp, vp, mask=prompt_mask, scale=scale)
    out_c = group_attention(qc, kc.astype(qc.dtype), vc.astype(qc.dtype), kp, vp, prompt_real, scale)
    return out_p_map(out_p.reshape(b, p, -1)), out_c_map(out_c.reshape(n, c, -1))

  def __call__(self, x, cos, sin, mask, kv, cache_index):
    """x [B, T, D]; mask: bool [B, 1, T, S] or, without a cache, a `SegmentMask` / `FusedSegments`; kv: this layer's cache (keys
    [B, K, H, S], values [B, K, S, H], then optionally a shared prefix's keys and values, see `KVCache`) or None.
    Returns the output [B, T, D] and the keys and values: the updated cache (new tokens written at `cache_index`,
    counted after any prefix's slots) or, without one, the new tokens' [B, T, K, H]."""
    b, t, _ = x.shape
    q, k, v, out_map = self.heads(x, cos, sin)
    scale = self.head_dim**-0.5
    if kv is None:
      if isinstance(mask, (SegmentMask, FusedSegments)):  # packed rows: a fused kernel or blocked jnp attention
        out = packed_attention(q, k.astype(q.dtype), v.astype(q.dtype), mask, scale)
        return out_map(out.reshape(b, t, -1)), (k, v)
      out = jax.nn.dot_product_attention(q, k.astype(q.dtype), v.astype(q.dtype), mask=mask, scale=scale)
      return out_map(out.reshape(b, t, -1)), (k, v)
    if hasattr(kv, "attend"):  # a paged cache's view of this layer (jaxcap.sampling.paged_cache.PagedLayer)
      out, kv = kv.attend(q, k, v, scale)
      return out_map(out.reshape(b, t, -1)), kv
    k_cache, v_cache, *prefix = kv
    own_index = cache_index - (prefix[1].shape[2] if prefix else 0)
    k_new = k.transpose(0, 2, 3, 1).astype(k_cache.dtype)  # [B, K, H, T]
    v_new = v.transpose(0, 2, 1, 3).astype(v_cache.dtype)  # [B, K, T, H]
    k_cache = shard(jax.lax.dynamic_update_slice_in_dim(k_cache, k_new, own_index, axis=3), CACHE_AXES)
    v_cache = shard(jax.lax.dynamic_update_slice_in_dim(v_cache, v_new, own_index, axis=2), CACHE_AXES)
    out = cached_attention(q, k_cache, v_cache, mask, scale, prefix=tuple(prefix) or None)
    return out_map(out.reshape(b, t, -1)), (k_cache, v_cache)


class DecoderLayer(nnx.Module):
  def __init__(self, cfg: Qwen25VLConfig, *, rngs):
    t = cfg.text
    self.input_layernorm = RMSNorm(t.hidden_size, t.rms_norm_eps, param_dtype=cfg.param_dtype)
    self.post_attention_layernorm = RMSNorm(t.hidden_size, t.rms_norm_eps, param_dtype=cfg.param_dtype)
    self.self_attn = Attention(cfg, rngs=rngs)
    self.mlp = SwiGLU(
      t.hidden_size, t.intermediate_size, bias=False, dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs
    )

  def shared(self, prompts, completions, prompt_rope, completion_rope, prompt_mask, prompt_real):
    """Both streams of the prompt-shared pass through the layer (`Attention.shared`): (prompts, completions)."""
    hp, hc = self.self_attn.shared(
      self.input_layernorm(prompts),
      self.input_layernorm(completions),
      prompt_rope,
      completion_rope,
      prompt_mask,
      prompt_real,
    )
    return self.feed_forward(prompts + hp), self.feed_forward(completions + hc)

  def feed_forward(self, x):
    x = shard(x, ("batch", None, None))
    return shard(x + self.mlp(self.post_attention_layernorm(x)), ("batch", None, None))

  def __call__(self, x, cos, sin, mask, kv, cache_index):
    h, kv = self.self_attn(self.input_layernorm(x), cos, sin, mask, kv, cache_index)
    return self.feed_forward(x + h), kv
