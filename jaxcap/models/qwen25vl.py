"""Qwen2.5-VL in Flax NNX: vision tower + Qwen2 decoder with multimodal RoPE (`decoder`), and a static-shape KV cache.

Shapes: B batch, T new tokens, S cache slots, D hidden, N query heads, K key/value heads, H head dim, V vocab.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
from flax import nnx

from jaxcap.models import lora, row_blocks
from jaxcap.models.config import Qwen25VLConfig
from jaxcap.models.decoder import ATTENTION, CACHE_AXES, Attention, DecoderLayer, KVCache, cached_attention
from jaxcap.models.layers import RMSNorm, linear, mrope_cos_sin, scan_layers, stacked
from jaxcap.models.packed_attention import packed_mask
from jaxcap.models.segment_attention import SegmentWindow, readable
from jaxcap.models.vision import VisionTower
from jaxcap.models.visual_tokens import ACT_AXES, DEEPSTACK_AXES, VisionInput, VisualTokens
from jaxcap.sharding import path_name, shard, shard_like_params


# the decoder's pieces, long imported from here
__all__ = ["CACHE_AXES", "Attention", "DecoderLayer", "KVCache", "Qwen25VL", "VisionInput", "cached_attention"]


class Qwen25VL(VisualTokens, nnx.Module):
  """The student policy: `Qwen2_5_VLForConditionalGeneration` semantics, param names mirroring HF's."""

  def __init__(self, cfg: Qwen25VLConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    t = cfg.text
    self.visual = self.vision_tower(cfg, rngs)
    self.embed_tokens = nnx.Embed(
      t.vocab_size,
      t.hidden_size,
      dtype=cfg.dtype,
      param_dtype=cfg.param_dtype,
      embedding_init=nnx.initializers.normal(0.02),
      rngs=rngs,
    )
    self.build_decoder(cfg, rngs)
    if not t.tie_word_embeddings:
      self.lm_head = linear(
        t.hidden_size, t.vocab_size, bias=False, dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs
      )

  def build_decoder(self, cfg: Qwen25VLConfig, rngs: nnx.Rngs) -> None:
    """The decoder's layer stack(s) and final norm (a family's hook: Qwen3.5's hybrid stacks)."""
    t = cfg.text
    # one module whose params carry a leading layer axis: the stack runs under lax.scan (compile time flat in depth)
    self.layers = stacked(lambda r: DecoderLayer(cfg, rngs=r), t.num_hidden_layers, rngs)
    self.norm = RMSNorm(t.hidden_size, t.rms_norm_eps, param_dtype=cfg.param_dtype)

  @staticmethod
  def vision_tower(cfg: Qwen25VLConfig, rngs: nnx.Rngs) -> nnx.Module:
    """The family's vision tower (a subclass's hook)."""
    return VisionTower(
      cfg.vision, dtype=cfg.dtype, param_dtype=cfg.param_dtype, remat=cfg.remat, unroll=not cfg.scan_layers, rngs=rngs
    )

  # ---------------------------------------------------------------- pieces
  def decode(
    self,
    x: jax.Array,
    positions: jax.Array,
    attention_mask: jax.Array,
    cache: KVCache | None = None,
    cache_index: jax.Array | int = 0,
    layers: tuple | None = None,
    segments: jax.Array | None = None,
    deepstack: jax.Array | None = None,
    segment_window: SegmentWindow | None = None,
    segment_parents: jax.Array | None = None,
  ) -> tuple[jax.Array, KVCache | None]:
    """Runs the decoder on embeddings x [B, T, D] at mRoPE `positions` int [3, B, T].

    Without a cache: `attention_mask` bool [B, T] marks real tokens; attention is causal over the T tokens, and
    with `segments` int [B, T] (packed rows, jaxcap.train.packing.rows) only within a token's own segment; with a
    static `segment_window` too (`segment_attention.segment_window`: no segment longer than its span), in query
    blocks over a key window (cost T x window, not T x T); on TPU / GPU through a fused kernel (`packed_attention`).
    `segment_parents` int [B, T]: a segment each token also reads (its group's shared prompt), jnp paths only.
    With a cache: the T new tokens are written at slots [cache_index, cache_index + T) and `attention_mask` is
    bool [B, S] over cache slots (real tokens, including the new ones); slot j is visible to slot i iff j <= i.
    Returns the final-norm hidden states [B, T, D] and the updated cache. `layers`: `layer_params()`, taken once
    by a caller that decodes in a loop. `deepstack` [n, B, T, D] (Qwen3-VL's DeepStack, prefill only): added to
    the output of each of the first n layers (zero away from the visual tokens).
    """
    b, t, _ = x.shape
    cos, sin = self.rope(positions)
    mask = self.attention_mask(attention_mask, t, cache, cache_index, segments, segment_window, segment_parents)
    x = shard(x, ("batch", None, None))
    if cache is None:
      body = lambda layer, x, _: layer(x, cos, sin, mask, None, cache_index)[0]
      unroll = not self.cfg.scan_layers
      # unrolled 16-bit layers each convert their own weights as they run (a float32 copy of one layer, not the stack)
      narrow = jnp.dtype(self.cfg.param_dtype).itemsize < 4
      kw = dict(policy=self.cfg.remat, unroll=unroll, per_layer_converts=unroll and narrow)
      n = 0 if deepstack is None else deepstack.shape[0]
      if n:  # the first n layers in a scan of their own, each adding its DeepStack slice to its output
        add = lambda layer, x, extra: shard(body(layer, x, None) + shard(extra, DEEPSTACK_AXES[1:]), ACT_AXES)
        x = scan_layers(self.layers, add, x, shard(deepstack.astype(x.dtype), DEEPSTACK_AXES), stop=n, **kw)
      x = scan_layers(self.layers, body, x, start=n, **kw)
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
      if deepstack is not None and i < deepstack.shape[0]:
        x = shard(x + shard(deepstack[i].astype(x.dtype), ACT_AXES), ACT_AXES)
      new_k.append(k)
      new_v.append(v)
    return self.norm(x), KVCache(tuple(new_k), tuple(new_v), cache.prefix_k, cache.prefix_v)

  def attention_mask(self, attention_mask, t, cache, cache_index, segments, segment_window, segment_parents):
    """The attention layers' mask of `decode`'s arguments (T = `t` new tokens): bool [B, 1, T, S], or for packed
    rows without a cache a fused kernel's / segment window's mask where either applies."""
    q_slot = cache_index + jnp.arange(t)
    k_slot = jnp.arange(cache.slots if cache is not None else t)
    packed = segments is not None and cache is None
    mask = packed_mask(segments, attention_mask, segment_window, segment_parents) if packed else None
    if mask is None:
      mask = (k_slot[None, :] <= q_slot[:, None])[None, None] & attention_mask.astype(bool)[:, None, None, :]
      if segments is not None:
        parent_q = None if segment_parents is None else segment_parents[:, None, :, None]
        mask = mask & readable(segments[:, None, :, None], segments[:, None, None, :], parent_q)
    return mask

  def rope(self, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The decoder's rotary (cos, sin) at mRoPE `positions` int [3, B, T]."""
    t = self.cfg.text
    return mrope_cos_sin(positions, t.head_dim, t.rope_theta, t.mrope_section, t.mrope_interleaved)

  def empty_cache(self, batch: int, slots: int) -> KVCache:
    """A zeroed cache of `slots` slots for `batch` rows (what a prefill writes into)."""
    return KVCache.zeros(self.cfg, batch, slots)

  @staticmethod
  def decoder_stacks(cfg) -> list[tuple[str, tuple[int, ...]]]:
    """The decoder's stacked modules by attribute name, each with the decoder index of its entries."""
    return [("layers", tuple(range(cfg.text.num_hidden_layers)))]

  @staticmethod
  def cache_parts(cache: KVCache) -> tuple[KVCache, tuple]:
    """(the attention layers' `KVCache`, the recurrent layers' per-row states) of a cache `decode` returned:
    (the cache, ()) here (Qwen3.5's `HybridCache` holds both)."""
    return cache, ()

  @classmethod
  def empty_states(cls, cfg: Qwen25VLConfig, batch: int) -> tuple:
    """Zeroed recurrent states of `batch` rows, one per layer of kind RECURRENT (`layer_graphs`), as `cache_parts`
    gives them: none here."""
    return ()

  def layer_graphs(self) -> tuple:
    """(kind, graphdef) of each decoder layer, in `layer_params` order: a per-layer caller (the paged engine's
    decode step) merges each layer's params with its graphdef and calls it as its kind says
    (`jaxcap.models.decoder.ATTENTION` / `RECURRENT`)."""
    return ((ATTENTION, nnx.graphdef(self.layers)),) * self.cfg.text.num_hidden_layers

  def layer_params(self, rows: int | None = None) -> tuple:
    """The decoder's per-layer param states, sliced from the stack (for `decode(..., layers=...)`). With `rows`
    (the loop's batch rows), kernels are laid out in `row_blocks` where that applies (few rows, on CPU)."""
    return self.stack_layer_params(self.layers, rows)

  def stack_layer_params(self, layers: nnx.Module, rows: int | None = None) -> tuple:
    """`layer_params` of one stacked module of layers."""
    stack = nnx.state(layers)
    # not under LoRA: qwix computes x W with W as laid out when it made the adapters ([in, out])
    blocked = rows is not None and row_blocks.applies(rows) and not lora.has_adapters(stack)

    def layout(path, a):
      blocks = blocked and re.search(r"kernel(\.value)?$", path_name(path)) is not None and a.ndim == 2
      return row_blocks.from_kernel(a) if blocks else a

    # each slice keeps its params' sharding, so a sharded model is gathered layer by layer where it is used, never
    # whole up front
    return tuple(
      jax.tree_util.tree_map_with_path(layout, shard_like_params(jax.tree.map(lambda a, i=i: a[i], stack)))
      for i in range(jax.tree.leaves(stack)[0].shape[0])
    )

  def head_params(self, rows: int | None = None) -> jax.Array | None:
    """The LM head in `row_blocks` for a loop computing logits of `rows` rows, or None where they do not apply
    or `rows` is None (for `logits(..., head=...)`). A tied head is a reshape of the embedding; an untied one a
    transposed copy."""
    if rows is None or not row_blocks.applies(rows):
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
    x, deepstack = self.embed_vision(input_ids, vision)
    hidden, cache = self.decode(x, positions, attention_mask, cache, cache_index, deepstack=deepstack)
    return self.logits(hidden), cache
