"""Qwen3.5 (dense) in Flax NNX: `Qwen3_5ForConditionalGeneration` semantics, param names mirroring HF's.

The Qwen3-VL vision tower without DeepStack, and a hybrid decoder (`qwen35_layers`): Gated DeltaNet layers and gated
full-attention layers in `layer_types` order. The two kinds live in two stacks (`linear_layers`,
`attention_layers`, each with a leading layer axis); a regular pattern (k - 1 linear then one full, as every
released checkpoint) runs under one `lax.scan` over blocks of k layers. The cache (`HybridCache`) holds the
attention layers' `KVCache` and each linear layer's fixed-size `LinearState`.

Shapes: B batch, T new tokens, S cache slots, D hidden.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import nnx

from jaxcap.models import row_blocks
from jaxcap.models.decoder import ATTENTION, CACHE_AXES, RECURRENT, KVCache
from jaxcap.models.layers import mrope_cos_sin, remat, stacked
from jaxcap.models.qwen35_config import FULL, LINEAR, Qwen35Config
from jaxcap.models.qwen35_layers import AttentionLayer, LinearLayer, LinearState, ZeroCenteredRMSNorm
from jaxcap.models.qwen3vl import Qwen3VL
from jaxcap.sharding import shard

ACT_AXES = ("batch", None, None)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class HybridCache:
  """The attention layers' `KVCache` (slots, shared prefix: its contract) and one `LinearState` per linear layer.
  A grown cache shares the prompt's keys and values and gives each of the G rows of a prompt its own copy of the
  prompt's linear states (small and fixed-size, and each row's diverge at its first token)."""

  kv: KVCache
  linear: tuple[LinearState, ...]

  @classmethod
  def zeros(cls, cfg: Qwen35Config, batch: int, slots: int, dtype=None) -> "HybridCache":
    t = cfg.text
    dtype = dtype or cfg.dtype
    kv_heads, head_dim = t.num_key_value_heads, t.head_dim
    zeros = lambda shape: tuple(shard(jnp.zeros(shape, dtype), CACHE_AXES) for _ in t.layer_indices(FULL))
    kv = KVCache(zeros((batch, kv_heads, head_dim, slots)), zeros((batch, kv_heads, slots, head_dim)))
    return cls(kv, tuple(LinearState.zeros(cfg, batch, dtype) for _ in t.layer_indices(LINEAR)))

  @property
  def prefix_slots(self) -> int:
    return self.kv.prefix_slots

  @property
  def slots(self) -> int:
    return self.kv.slots

  def grow(self, repeats: int, slots: int) -> "HybridCache":
    rep = lambda a: jnp.repeat(a, repeats, axis=0)
    return HybridCache(self.kv.grow(repeats, slots), tuple(jax.tree.map(rep, s) for s in self.linear))


class Qwen35(Qwen3VL):
  """The Qwen3.5 student. Its vision path (`embed_vision`, `place_visual`), LM head and `__call__` are
  `Qwen25VL`'s; the decoder is the hybrid one."""

  def build_decoder(self, cfg: Qwen35Config, rngs: nnx.Rngs) -> None:
    t = cfg.text
    self.linear_layers = stacked(lambda r: LinearLayer(cfg, rngs=r), len(t.layer_indices(LINEAR)), rngs)
    self.attention_layers = stacked(lambda r: AttentionLayer(cfg, rngs=r), len(t.layer_indices(FULL)), rngs)
    self.norm = ZeroCenteredRMSNorm(t.hidden_size, t.rms_norm_eps, param_dtype=cfg.param_dtype)

  def empty_cache(self, batch: int, slots: int) -> HybridCache:
    return HybridCache.zeros(self.cfg, batch, slots)

  def rope(self, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The rotary of the first `rotary_dim` of each head (interleaved mRoPE) at `positions` int [3, B, T]."""
    t = self.cfg.text
    return mrope_cos_sin(positions, t.rotary_dim, t.rope_theta, t.mrope_section, True)

  @staticmethod
  def cache_parts(cache: HybridCache) -> tuple[KVCache, tuple[LinearState, ...]]:
    return cache.kv, cache.linear

  @classmethod
  def empty_states(cls, cfg: Qwen35Config, batch: int) -> tuple[LinearState, ...]:
    """One zeroed `LinearState` of `batch` rows per linear layer (in the compute dtype: as a prefill leaves them)."""
    return tuple(LinearState.zeros(cfg, batch) for _ in cfg.text.layer_indices(LINEAR))

  def layer_graphs(self) -> tuple:
    """(kind, graphdef) of each layer in `layer_types` order: linear layers RECURRENT (their state a
    `LinearState`), full-attention layers ATTENTION."""
    lin, att = (RECURRENT, nnx.graphdef(self.linear_layers)), (ATTENTION, nnx.graphdef(self.attention_layers))
    return tuple(lin if kind == LINEAR else att for kind in self.cfg.text.layer_types)

  @property
  def block_period(self) -> int | None:
    """k where `layer_types` is (k - 1 linear, 1 full) repeated; None for any other pattern (run unrolled)."""
    types = self.cfg.text.layer_types
    k = types.index(FULL) + 1 if FULL in types else 0
    regular = (
      k and len(types) % k == 0 and all(x == (FULL if (i + 1) % k == 0 else LINEAR) for i, x in enumerate(types))
    )
    return k if regular else None

  def decode(
    self,
    x: jax.Array,
    positions: jax.Array,
    attention_mask: jax.Array,
    cache: HybridCache | None = None,
    cache_index: jax.Array | int = 0,
    layers: tuple | None = None,
    segments: jax.Array | None = None,
    deepstack: jax.Array | None = None,
    segment_window=None,
    segment_parents: jax.Array | None = None,
  ) -> tuple[jax.Array, HybridCache | None]:
    """`Qwen25VL.decode`'s contract. Linear layers read the real tokens' mask (without a cache `attention_mask`
    itself; with one, its slots of the T new tokens) and, in packed rows, `segments`."""
    if deepstack is not None:
      raise ValueError("Qwen3.5 has no DeepStack features")
    if segment_parents is not None:
      raise NotImplementedError(
        "Qwen3.5 packed rows with shared prompts (segment_parents): the linear layers would need each prompt's final "
        "state; train with model.share_prompt=False or unpacked passes"
      )
    b, t, _ = x.shape
    tc = self.cfg.text
    cos, sin = self.rope(positions)
    mask = self.attention_mask(attention_mask, t, cache, cache_index, segments, segment_window, None)
    x = shard(x, ACT_AXES)
    if cache is None:
      real = attention_mask.astype(bool)
      attend = lambda layer, x: layer(x, cos, sin, mask, None, cache_index)[0]
      mix = lambda layer, x: layer(x, real, None, segments)[0]
      return self.norm(self.run_layers(x, mix, attend)), None

    real = jax.lax.dynamic_slice_in_dim(attention_mask.astype(bool), cache_index, t, axis=1)
    lin_graph, att_graph = nnx.graphdef(self.linear_layers), nnx.graphdef(self.attention_layers)
    new_k, new_v, new_linear = [], [], []
    for i, params in enumerate(layers if layers is not None else self.layer_params()):
      x, params = jax.lax.optimization_barrier((x, params))
      params = row_blocks.in_step(params, x)
      if tc.layer_types[i] == FULL:
        j = len(new_k)
        kv = (cache.kv.k[j], cache.kv.v[j]) + (
          (cache.kv.prefix_k[j], cache.kv.prefix_v[j]) if cache.kv.prefix_k else ()
        )
        x, (k, v) = nnx.merge(att_graph, params)(x, cos, sin, mask, kv, cache_index)
        new_k.append(k)
        new_v.append(v)
      else:
        x, state = nnx.merge(lin_graph, params)(x, real, cache.linear[len(new_linear)])
        new_linear.append(state)
    kv = KVCache(tuple(new_k), tuple(new_v), cache.kv.prefix_k, cache.kv.prefix_v)
    return self.norm(x), HybridCache(kv, tuple(new_linear))

  def decode_shared(self, prompts, prompt_positions, prompt_mask, completions, completion_positions, deepstack=None):
    """`jaxcap.models.shared_decode.decode_shared` for the hybrid decoder: attention layers as there (completions
    read their prompt's keys and values, `Attention.shared`); a linear layer runs each prompt once from a zero state
    and each of its G completions from the prompt's final state (conv inputs and delta state), so the gradients of
    the G continuations meet in the prompt's pass."""
    if deepstack is not None:
      raise ValueError("Qwen3.5 has no DeepStack features")
    tc = self.cfg.text
    b, p, _ = prompts.shape
    g = completions.shape[0] // b
    rope = lambda pos: mrope_cos_sin(pos, tc.rotary_dim, tc.rope_theta, tc.mrope_section, True)
    prompt_rope = rope(prompt_positions)
    completion_rope = tuple(jnp.repeat(x, g, axis=0) for x in rope(completion_positions))
    real = prompt_mask.astype(bool)
    causal = jnp.tril(jnp.ones((p, p), bool))[None, None] & real[:, None, None, :]
    completion_real = jnp.ones(completions.shape[:2], bool)

    def attend(layer, streams):
      return layer.shared(*streams, prompt_rope, completion_rope, causal, real)

    def mix(layer, streams):
      xp, state = layer(streams[0], real, LinearState.zeros(self.cfg, b, streams[0].dtype))
      xc, _ = layer(streams[1], completion_real, jax.tree.map(lambda a: jnp.repeat(a, g, axis=0), state))
      return xp, xc

    xp, xc = self.run_layers((shard(prompts, ACT_AXES), shard(completions, ACT_AXES)), mix, attend)
    return self.norm(xp), self.norm(xc)

  def run_layers(self, x, mix, attend):
    """x through every layer in order without a cache: `mix(linear_layer, x)` / `attend(attention_layer, x)`,
    each rematerialised per `cfg.remat`; a regular pattern under one scan over blocks unless `scan_layers` is off."""
    lin_graph, lin = nnx.split(self.linear_layers)
    att_graph, att = nnx.split(self.attention_layers)
    policy = self.cfg.remat
    mix_fn = functools.partial(remat, policy=policy)(lambda p, x: mix(nnx.merge(lin_graph, p), x))
    att_fn = functools.partial(remat, policy=policy)(lambda p, x: attend(nnx.merge(att_graph, p), x))
    k = self.block_period
    if k is None or not self.cfg.scan_layers:
      counts = {LINEAR: 0, FULL: 0}
      for kind in self.cfg.text.layer_types:
        i = counts[kind]
        counts[kind] += 1
        if kind == FULL:
          x = att_fn(jax.tree.map(lambda a, i=i: a[i], att), x)
        else:
          x = mix_fn(jax.tree.map(lambda a, i=i: a[i], lin), x)
      return x
    blocks = len(self.cfg.text.layer_types) // k
    lin = jax.tree.map(lambda a: a.reshape(blocks, k - 1, *a.shape[1:]), lin)

    def block(x, params):
      lin_block, att_layer = params
      for j in range(k - 1):
        x = mix_fn(jax.tree.map(lambda a, j=j: a[j], lin_block), x)
      return att_fn(att_layer, x), None

    return jax.lax.scan(block, x, (lin, att))[0]

  @staticmethod
  def decoder_stacks(cfg) -> list[tuple[str, tuple[int, ...]]]:
    return [("linear_layers", cfg.text.layer_indices(LINEAR)), ("attention_layers", cfg.text.layer_indices(FULL))]

  def layer_params(self, rows: int | None = None) -> tuple:
    """Every decoder layer's param state in `layer_types` order (each sliced from its kind's stack), with
    kernels in `row_blocks` for a loop of few `rows` where that applies (`Qwen25VL.layer_params`)."""
    lin = self.stack_layer_params(self.linear_layers, rows)
    att = self.stack_layer_params(self.attention_layers, rows)
    order, seen = [], {LINEAR: 0, FULL: 0}
    for kind in self.cfg.text.layer_types:
      order.append((lin if kind == LINEAR else att)[seen[kind]])
      seen[kind] += 1
    return tuple(order)
