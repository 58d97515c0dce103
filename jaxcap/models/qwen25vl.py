"""Qwen2.5-VL in Flax NNX: vision tower + Qwen2 decoder with multimodal RoPE, and a static-shape KV cache.

Shapes: B batch, T new tokens, S cache slots, D hidden, N query heads, K key/value heads, H head dim, V vocab.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from jaxcap.models.config import Qwen25VLConfig
from jaxcap.models.layers import RMSNorm, SwiGLU, apply_rotary, linear, mrope_cos_sin, scan_layers, stacked
from jaxcap.models.vision import VisionLayout, VisionTower
from jaxcap.sharding import shard, shard_like_params


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
  """Per-layer keys and values, each [B, S, K, H]. Slots are written at `cache_index` by the caller's schedule.

  One buffer per layer (not one stacked [L, ...] array): each decode step then updates every layer's buffer in
  place and attends over it directly; a stacked cache costs a copy of the layer's slice per layer and step."""

  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]

  @classmethod
  def zeros(cls, cfg: Qwen25VLConfig, batch: int, slots: int, dtype=None) -> "KVCache":
    t = cfg.text
    shape = (batch, slots, t.num_key_value_heads, t.head_dim)
    make = lambda: tuple(shard(jnp.zeros(shape, dtype or cfg.dtype), CACHE_AXES) for _ in range(t.num_hidden_layers))
    return cls(make(), make())

  @property
  def slots(self) -> int:
    return self.k[0].shape[1]


CACHE_AXES = ("batch", None, "kv_heads", None)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class VisionInput:
  """Patches of all images then all videos of a batch, in prompt order, with their host-computed layout.

  pixel_values: float [L, patch_dim]; layout: `vision_layout(grid_thw)` of the same items.
  """

  pixel_values: jax.Array
  layout: VisionLayout


class Attention(nnx.Module):
  """GQA self-attention with q/k/v biases; `jax.nn.dot_product_attention` picks the fused kernel per backend."""

  def __init__(self, cfg: Qwen25VLConfig, *, rngs):
    t = cfg.text
    self.num_heads, self.num_kv_heads, self.head_dim = t.num_attention_heads, t.num_key_value_heads, t.head_dim
    kw = dict(dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs)
    self.q_proj = linear(t.hidden_size, self.num_heads * self.head_dim, bias=True, **kw)
    self.k_proj = linear(t.hidden_size, self.num_kv_heads * self.head_dim, bias=True, **kw)
    self.v_proj = linear(t.hidden_size, self.num_kv_heads * self.head_dim, bias=True, **kw)
    self.o_proj = linear(self.num_heads * self.head_dim, t.hidden_size, bias=False, **kw)

  def __call__(self, x, cos, sin, mask, kv, cache_index):
    """x [B, T, D]; kv: this layer's cache (k, v) [B, S, K, H] or None. Returns the output [B, T, D] and the keys
    and values: the updated cache (new tokens written at `cache_index`) or, without one, the new tokens'."""
    b, t, _ = x.shape
    q = self.q_proj(x).reshape(b, t, self.num_heads, self.head_dim)
    k = self.k_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim)
    v = self.v_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim)
    q = shard(apply_rotary(q, cos, sin), ("batch", None, "heads", None))
    k = apply_rotary(k, cos, sin)
    if kv is not None:
      k = jax.lax.dynamic_update_slice_in_dim(kv[0], k.astype(kv[0].dtype), cache_index, axis=1)
      v = jax.lax.dynamic_update_slice_in_dim(kv[1], v.astype(kv[1].dtype), cache_index, axis=1)
      k = shard(k, CACHE_AXES)
      v = shard(v, CACHE_AXES)
    out = jax.nn.dot_product_attention(q, k.astype(q.dtype), v.astype(q.dtype), mask=mask, scale=self.head_dim**-0.5)
    return self.o_proj(out.reshape(b, t, -1)), (k, v)


class DecoderLayer(nnx.Module):
  def __init__(self, cfg: Qwen25VLConfig, *, rngs):
    t = cfg.text
    self.input_layernorm = RMSNorm(t.hidden_size, t.rms_norm_eps, param_dtype=cfg.param_dtype)
    self.post_attention_layernorm = RMSNorm(t.hidden_size, t.rms_norm_eps, param_dtype=cfg.param_dtype)
    self.self_attn = Attention(cfg, rngs=rngs)
    self.mlp = SwiGLU(
      t.hidden_size, t.intermediate_size, bias=False, dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs
    )

  def __call__(self, x, cos, sin, mask, kv, cache_index):
    h, kv = self.self_attn(self.input_layernorm(x), cos, sin, mask, kv, cache_index)
    x = shard(x + h, ("batch", None, None))
    x = x + self.mlp(self.post_attention_layernorm(x))
    return shard(x, ("batch", None, None)), kv


class Qwen25VL(nnx.Module):
  """The student policy: `Qwen2_5_VLForConditionalGeneration` semantics, param names mirroring HF's."""

  def __init__(self, cfg: Qwen25VLConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    t = cfg.text
    self.visual = VisionTower(
      cfg.vision,
      dtype=cfg.dtype,
      param_dtype=cfg.param_dtype,
      remat=cfg.remat,
      unroll=not cfg.scan_layers,
      rngs=rngs,
    )
    self.embed_tokens = nnx.Embed(
      t.vocab_size,
      t.hidden_size,
      dtype=cfg.dtype,
      param_dtype=cfg.param_dtype,
      embedding_init=nnx.initializers.normal(0.02),
      rngs=rngs,
    )
    # one module whose params carry a leading layer axis: the stack runs under lax.scan (compile time flat in depth)
    self.layers = stacked(lambda r: DecoderLayer(cfg, rngs=r), t.num_hidden_layers, rngs)
    self.norm = RMSNorm(t.hidden_size, t.rms_norm_eps, param_dtype=cfg.param_dtype)
    if not t.tie_word_embeddings:
      self.lm_head = linear(
        t.hidden_size, t.vocab_size, bias=False, dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs
      )

  # ---------------------------------------------------------------- pieces
  def embed(self, input_ids: jax.Array, vision: VisionInput | None = None) -> jax.Array:
    """Token embeddings [B, T, D] with visual features placed, in order, at image-pad then video-pad tokens."""
    x = self.embed_tokens(input_ids)
    if vision is None:
      return x
    feats = self.visual(vision.pixel_values, vision.layout).astype(x.dtype)  # [Ni + Nv, D]
    is_img = (input_ids == self.cfg.image_token_id).reshape(-1)
    is_vid = (input_ids == self.cfg.video_token_id).reshape(-1)
    img_idx = jnp.cumsum(is_img) - 1
    vid_idx = jnp.sum(is_img) + jnp.cumsum(is_vid) - 1
    idx = jnp.clip(jnp.where(is_img, img_idx, jnp.where(is_vid, vid_idx, 0)), 0, feats.shape[0] - 1)
    placed = feats[idx].reshape(x.shape)
    return jnp.where((is_img | is_vid).reshape(*x.shape[:2], 1), placed, x)

  def decode(
    self,
    x: jax.Array,
    positions: jax.Array,
    attention_mask: jax.Array,
    cache: KVCache | None = None,
    cache_index: jax.Array | int = 0,
    layers: tuple | None = None,
  ) -> tuple[jax.Array, KVCache | None]:
    """Runs the decoder on embeddings x [B, T, D] at mRoPE `positions` int [3, B, T].

    Without a cache: `attention_mask` bool [B, T] marks real tokens; attention is causal over the T tokens.
    With a cache: the T new tokens are written at slots [cache_index, cache_index + T) and `attention_mask` is
    bool [B, S] over cache slots (real tokens, including the new ones); slot j is visible to slot i iff j <= i.
    Returns the final-norm hidden states [B, T, D] and the updated cache. `layers`: `layer_params()`, taken once
    by a caller that decodes in a loop.
    """
    b, t, _ = x.shape
    cfg = self.cfg.text
    cos, sin = mrope_cos_sin(positions, cfg.head_dim, cfg.rope_theta, cfg.mrope_section)
    q_slot = cache_index + jnp.arange(t)
    k_slot = jnp.arange(cache.slots if cache is not None else t)
    mask = (k_slot[None, :] <= q_slot[:, None])[None, None] & attention_mask.astype(bool)[:, None, None, :]
    x = shard(x, ("batch", None, None))
    if cache is None:
      body = lambda layer, x, _: layer(x, cos, sin, mask, None, cache_index)[0]
      x = scan_layers(self.layers, body, x, policy=self.cfg.remat, unroll=not self.cfg.scan_layers)
      return self.norm(x), None

    # With a cache (prefill, decode): the layers run unrolled, each on its own slice of the stacked weights,
    # which the caller can take once outside its decode loop (`layer_params`); a scan would slice (copy) every
    # layer's weights and cache at every step of a bandwidth-bound loop.
    graphdef = nnx.graphdef(self.layers)
    new_k, new_v = [], []
    for i, params in enumerate(layers if layers is not None else self.layer_params()):
      # ties the layer's weights to this step's activations: XLA cannot hoist their all-gather (sharded models)
      # out of a decode loop, which would hold every layer's gathered weights at once
      x, params = jax.lax.optimization_barrier((x, params))
      x, (k, v) = nnx.merge(graphdef, params)(x, cos, sin, mask, (cache.k[i], cache.v[i]), cache_index)
      new_k.append(k)
      new_v.append(v)
    return self.norm(x), KVCache(tuple(new_k), tuple(new_v))

  def layer_params(self) -> tuple:
    """The decoder's per-layer param states, sliced from the stack (for `decode(..., layers=...)`)."""
    stack = nnx.state(self.layers)
    # each slice keeps its params' sharding, so a sharded model is gathered layer by layer where it is used, never
    # whole up front
    return tuple(
      shard_like_params(jax.tree.map(lambda a, i=i: a[i], stack)) for i in range(self.cfg.text.num_hidden_layers)
    )

  def logits(self, hidden: jax.Array) -> jax.Array:
    """hidden [..., D] -> float32 logits [..., V]."""
    lead = hidden.shape[:-1]
    flat = hidden.reshape(-1, hidden.shape[-1])  # 2-D: a faster weight gradient on XLA:CPU (see layers.Linear)
    if self.cfg.text.tie_word_embeddings:
      w = self.embed_tokens.embedding[...]
      out = jnp.einsum("nd,vd->nv", flat, w.astype(hidden.dtype), preferred_element_type=jnp.float32)
    else:
      out = jnp.einsum(
        "nd,dv->nv", flat, self.lm_head.kernel[...].astype(hidden.dtype), preferred_element_type=jnp.float32
      )
    out = out.reshape(*lead, out.shape[-1])
    return shard(out, ("batch", None, "vocab"))

  def __call__(
    self,
    input_ids: jax.Array,
    positions: jax.Array,
    attention_mask: jax.Array,
    vision: VisionInput | None = None,
    cache: KVCache | None = None,
    cache_index: jax.Array | int = 0,
  ) -> tuple[jax.Array, KVCache | None]:
    """input_ids int [B, T] -> (float32 logits [B, T, V], updated cache). See `decode` for the mask contract."""
    hidden, cache = self.decode(self.embed(input_ids, vision), positions, attention_mask, cache, cache_index)
    return self.logits(hidden), cache
