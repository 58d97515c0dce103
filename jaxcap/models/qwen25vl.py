"""Qwen2.5-VL in Flax NNX: vision tower + Qwen2 decoder with multimodal RoPE, and a static-shape KV cache.

Shapes: B batch, T new tokens, S cache slots, D hidden, N query heads, K key/value heads, H head dim, V vocab.
"""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
from flax import nnx

from jaxcap.models import row_blocks
from jaxcap.models.config import Qwen25VLConfig
from jaxcap.models.layers import RMSNorm, SwiGLU, apply_rotary, linear, mrope_cos_sin, scan_layers, stacked
from jaxcap.models.vision import VisionLayout, VisionTower
from jaxcap.sharding import path_name, shard, shard_like_params


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


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class VisionInput:
  """Patches of all images then all videos of a batch, in prompt order, with their host-computed layout.

  pixel_values: float [L, patch_dim]; layout: `vision_layout(grid_thw)` of the same items.
  """

  pixel_values: jax.Array
  layout: VisionLayout


class Attention(nnx.Module):
  """GQA self-attention with q/k/v biases: `jax.nn.dot_product_attention` (the fused kernel per backend) without a
  cache, `cached_attention` over a `KVCache`."""

  def __init__(self, cfg: Qwen25VLConfig, *, rngs):
    t = cfg.text
    self.num_heads, self.num_kv_heads, self.head_dim = t.num_attention_heads, t.num_key_value_heads, t.head_dim
    kw = dict(dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs)
    self.q_proj = linear(t.hidden_size, self.num_heads * self.head_dim, bias=True, **kw)
    self.k_proj = linear(t.hidden_size, self.num_kv_heads * self.head_dim, bias=True, **kw)
    self.v_proj = linear(t.hidden_size, self.num_kv_heads * self.head_dim, bias=True, **kw)
    self.o_proj = linear(self.num_heads * self.head_dim, t.hidden_size, bias=False, **kw)

  def __call__(self, x, cos, sin, mask, kv, cache_index):
    """x [B, T, D]; kv: this layer's cache (keys [B, K, H, S], values [B, K, S, H], then optionally a shared
    prefix's keys and values, see `KVCache`) or None. Returns the output [B, T, D] and the keys and values: the
    updated cache (new tokens written at `cache_index`, counted after any prefix's slots) or, without one, the new
    tokens' [B, T, K, H]."""
    b, t, _ = x.shape
    q = self.q_proj(x).reshape(b, t, self.num_heads, self.head_dim)
    k = self.k_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim)
    v = self.v_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim)
    q = shard(apply_rotary(q, cos, sin), ("batch", None, "heads", None))
    k = apply_rotary(k, cos, sin)
    scale = self.head_dim**-0.5
    if kv is None:
      out = jax.nn.dot_product_attention(q, k.astype(q.dtype), v.astype(q.dtype), mask=mask, scale=scale)
      return self.o_proj(out.reshape(b, t, -1)), (k, v)
    if hasattr(kv, "attend"):  # a paged cache's view of this layer (jaxcap.sampling.paged_cache.PagedLayer)
      out, kv = kv.attend(q, k, v, scale)
      return self.o_proj(out.reshape(b, t, -1)), kv
    k_cache, v_cache, *prefix = kv
    own_index = cache_index - (prefix[1].shape[2] if prefix else 0)
    k_new = k.transpose(0, 2, 3, 1).astype(k_cache.dtype)  # [B, K, H, T]
    v_new = v.transpose(0, 2, 1, 3).astype(v_cache.dtype)  # [B, K, T, H]
    k_cache = shard(jax.lax.dynamic_update_slice_in_dim(k_cache, k_new, own_index, axis=3), CACHE_AXES)
    v_cache = shard(jax.lax.dynamic_update_slice_in_dim(v_cache, v_new, own_index, axis=2), CACHE_AXES)
    out = cached_attention(q, k_cache, v_cache, mask, scale, prefix=tuple(prefix) or None)
    return self.o_proj(out.reshape(b, t, -1)), (k_cache, v_cache)


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
    segments: jax.Array | None = None,
  ) -> tuple[jax.Array, KVCache | None]:
    """Runs the decoder on embeddings x [B, T, D] at mRoPE `positions` int [3, B, T].

    Without a cache: `attention_mask` bool [B, T] marks real tokens; attention is causal over the T tokens, and
    with `segments` int [B, T] (packed rows, jaxcap.train.packing) only within a token's own segment.
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
    if segments is not None:
      mask = mask & (segments[:, None, :, None] == segments[:, None, None, :])
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
      params = row_blocks.in_step(params, x)  # XLA:CPU's float32 copies of bf16 weights: one layer at a time
      kv = (cache.k[i], cache.v[i]) + ((cache.prefix_k[i], cache.prefix_v[i]) if cache.prefix_k else ())
      x, (k, v) = nnx.merge(graphdef, params)(x, cos, sin, mask, kv, cache_index)
      new_k.append(k)
      new_v.append(v)
    return self.norm(x), KVCache(tuple(new_k), tuple(new_v), cache.prefix_k, cache.prefix_v)

  def layer_params(self, rows: int | None = None) -> tuple:
    """The decoder's per-layer param states, sliced from the stack (for `decode(..., layers=...)`). With `rows`
    (the loop's batch rows), kernels are laid out in `row_blocks` where that applies (few rows, on CPU)."""
    stack = nnx.state(self.layers)
    blocked = rows is not None and row_blocks.applies(rows)

    def layout(path, a):
      blocks = blocked and re.search(r"kernel(\.value)?$", path_name(path)) is not None and a.ndim == 2
      return row_blocks.from_kernel(a) if blocks else a

    # each slice keeps its params' sharding, so a sharded model is gathered layer by layer where it is used, never
    # whole up front
    return tuple(
      jax.tree_util.tree_map_with_path(layout, shard_like_params(jax.tree.map(lambda a, i=i: a[i], stack)))
      for i in range(self.cfg.text.num_hidden_layers)
    )

  def head_params(self, rows: int) -> jax.Array | None:
    """The LM head in `row_blocks` for a loop computing logits of `rows` rows, or None where they do not apply
    (for `logits(..., head=...)`). A tied head is a reshape of the embedding; an untied one a transposed copy."""
    if not row_blocks.applies(rows):
      return None
    if self.cfg.text.tie_word_embeddings:
      return row_blocks.from_rows(self.embed_tokens.embedding[...])
    kernel = self.lm_head.kernel[...]
    return kernel if kernel.ndim == 3 else row_blocks.from_kernel(kernel)  # 3-D: held in row blocks already

  def logits(self, hidden: jax.Array, head: jax.Array | None = None) -> jax.Array:
    """hidden [..., D] -> float32 logits [..., V]. `head`: `head_params(rows)`, taken once outside a loop."""
    lead = hidden.shape[:-1]
    flat = hidden.reshape(-1, hidden.shape[-1])  # 2-D: a faster weight gradient on XLA:CPU (see layers.Linear)
    if head is None and not self.cfg.text.tie_word_embeddings and self.lm_head.kernel.ndim == 3:
      head = self.lm_head.kernel[...]  # held in row blocks (`jaxcap.sampling.decode_layout`)
    if head is not None:
      out = row_blocks.matmul(flat, head.astype(hidden.dtype), preferred_element_type=jnp.float32)
    elif self.cfg.text.tie_word_embeddings:
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
