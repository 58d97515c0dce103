"""Qwen3.5's decoder layers: the gated full-attention layer and the Gated DeltaNet (linear attention) layer, with
the zero-centred RMSNorm both use. `transformers`' `Qwen3_5DecoderLayer` semantics, param names mirroring HF's.

Shapes: B batch, T new tokens, D hidden, C conv channels (queries, keys, values of a linear layer), K conv taps,
Hk / Hv key / value heads of a linear layer with Dk / Dv dims.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from jaxcap.models.decoder import Attention, DecoderLayer
from jaxcap.models.gated_delta import causal_conv1d, chunk_gated_delta, gated_rms_norm, recurrent_gated_delta
from jaxcap.models.layers import SwiGLU, apply_rotary, linear
from jaxcap.models.qwen35_config import Qwen35Config
from jaxcap.sharding import shard


class ZeroCenteredRMSNorm(nnx.Module):
  """RMSNorm with gain (1 + weight), weight initialised at 0, the product taken in float32 then cast
  (`Qwen3_5RMSNorm`, Gemma's norm)."""

  def __init__(self, dim: int, eps: float, *, param_dtype=jnp.float32):
    self.weight = nnx.Param(jnp.zeros((dim,), param_dtype))
    self.eps = eps

  def __call__(self, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return (x32 * (1.0 + self.weight[...].astype(jnp.float32))).astype(x.dtype)


def partial_rotary(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """The rotary on the first cos.shape[-1] dims of each head of x [..., T, heads, H]; the rest pass unchanged."""
  r = cos.shape[-1]
  return jnp.concatenate([apply_rotary(x[..., :r], cos, sin), x[..., r:]], axis=-1)


class GatedAttention(Attention):
  """`Qwen3_5Attention`: GQA whose q_proj yields each head's query and an output gate (sigmoid, per channel),
  zero-centred q / k norms, partial rotary. Cached, paged and packed paths are `Attention`'s."""

  def __init__(self, cfg: Qwen35Config, *, rngs):  # not super().__init__: it would build a plain q_proj and norms
    t = cfg.text
    self.num_heads, self.num_kv_heads, self.head_dim = t.num_attention_heads, t.num_key_value_heads, t.head_dim
    kw = dict(dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs)
    self.q_proj = linear(t.hidden_size, 2 * self.num_heads * self.head_dim, bias=False, **kw)
    self.k_proj = linear(t.hidden_size, self.num_kv_heads * self.head_dim, bias=False, **kw)
    self.v_proj = linear(t.hidden_size, self.num_kv_heads * self.head_dim, bias=False, **kw)
    self.o_proj = linear(self.num_heads * self.head_dim, t.hidden_size, bias=False, **kw)
    self.qk_norm = True
    self.q_norm = ZeroCenteredRMSNorm(self.head_dim, t.rms_norm_eps, param_dtype=cfg.param_dtype)
    self.k_norm = ZeroCenteredRMSNorm(self.head_dim, t.rms_norm_eps, param_dtype=cfg.param_dtype)

  def heads(self, x, cos, sin):
    """x [B, T, D] -> queries [B, T, N, H], keys and values [B, T, K, H] (rotary on the first cos.shape[-1] dims),
    and the output map: o_proj of the attention output times sigmoid(gate)."""
    b, t, _ = x.shape
    qg = self.q_proj(x).reshape(b, t, self.num_heads, 2 * self.head_dim)
    q, gate = qg[..., : self.head_dim], qg[..., self.head_dim :].reshape(b, t, -1)
    k = self.k_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim)
    v = self.v_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim)
    q, k = partial_rotary(self.q_norm(q), cos, sin), partial_rotary(self.k_norm(k), cos, sin)
    out_map = lambda out: self.o_proj(out * jax.nn.sigmoid(gate).astype(out.dtype))
    return shard(q, ("batch", None, "heads", None)), k, v, out_map

  def project(self, x, cos, sin):
    return self.heads(x, cos, sin)[:3]


class AttentionLayer(DecoderLayer):
  """A full-attention layer of the hybrid decoder: `DecoderLayer` with `GatedAttention` and zero-centred norms."""

  def __init__(self, cfg: Qwen35Config, *, rngs):  # not the parent's: its norms and attention differ
    t = cfg.text
    self.input_layernorm = ZeroCenteredRMSNorm(t.hidden_size, t.rms_norm_eps, param_dtype=cfg.param_dtype)
    self.post_attention_layernorm = ZeroCenteredRMSNorm(t.hidden_size, t.rms_norm_eps, param_dtype=cfg.param_dtype)
    self.self_attn = GatedAttention(cfg, rngs=rngs)
    self.mlp = SwiGLU(
      t.hidden_size, t.intermediate_size, bias=False, dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs
    )


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LinearState:
  """A linear layer's recurrent state per row: `conv` [B, K - 1, C] (the conv's last K - 1 inputs, in the compute
  dtype) and `delta` float32 [B, Hv, Dk, Dv] (the gated delta rule's state). Fixed size, whatever the length."""

  conv: jax.Array
  delta: jax.Array

  @classmethod
  def zeros(cls, cfg: Qwen35Config, batch: int, dtype=None) -> "LinearState":
    t = cfg.text
    return cls(
      jnp.zeros((batch, t.linear_conv_kernel_dim - 1, t.conv_dim), dtype or cfg.dtype),
      jnp.zeros((batch, t.linear_num_value_heads, t.linear_key_head_dim, t.linear_value_head_dim), jnp.float32),
    )


class DepthwiseConv(nnx.Module):
  """The conv's weight as HF stores it: [C, 1, K] (tap K - 1 multiplies the current token)."""

  def __init__(self, channels: int, taps: int, *, param_dtype, rngs: nnx.Rngs):
    self.weight = nnx.Param(nnx.initializers.normal(0.02)(rngs.params(), (channels, 1, taps), param_dtype))


class GatedNormWeight(nnx.Module):
  def __init__(self, dim: int, *, param_dtype):
    self.weight = nnx.Param(jnp.ones((dim,), param_dtype))


class GatedDeltaNet(nnx.Module):
  """`Qwen3_5GatedDeltaNet`: in_proj_qkv -> causal depthwise conv + SiLU -> the gated delta rule (q, k
  L2-normalised; beta = sigmoid(b); log decay g = -exp(A_log) softplus(a + dt_bias)) -> RMSNorm gated by
  SiLU(z) -> out_proj."""

  def __init__(self, cfg: Qwen35Config, *, rngs: nnx.Rngs):
    t = cfg.text
    self.hk, self.hv = t.linear_num_key_heads, t.linear_num_value_heads
    self.dk, self.dv = t.linear_key_head_dim, t.linear_value_head_dim
    self.eps = t.rms_norm_eps
    kw = dict(bias=False, dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs)
    self.in_proj_qkv = linear(t.hidden_size, t.conv_dim, **kw)
    self.in_proj_z = linear(t.hidden_size, t.linear_value_dim, **kw)
    self.in_proj_b = linear(t.hidden_size, self.hv, **kw)
    self.in_proj_a = linear(t.hidden_size, self.hv, **kw)
    self.conv1d = DepthwiseConv(t.conv_dim, t.linear_conv_kernel_dim, param_dtype=cfg.param_dtype, rngs=rngs)
    self.dt_bias = nnx.Param(jnp.ones((self.hv,), cfg.param_dtype))
    a = jax.random.uniform(rngs.params(), (self.hv,), jnp.float32, 0.01, 16.0)
    self.A_log = nnx.Param(jnp.log(a).astype(cfg.param_dtype))
    self.norm = GatedNormWeight(self.dv, param_dtype=cfg.param_dtype)
    self.out_proj = linear(t.linear_value_dim, t.hidden_size, **kw)

  def __call__(self, x, real, state: LinearState | None = None, segments=None):
    """x [B, T, D]; real bool [B, T] (padding's inputs are zeroed, so it never enters the state); `state`: the
    row's state before these tokens (None: a fresh sequence); `segments` int [B, T]: packed rows, each segment
    its own sequence (no state). Returns the output [B, T, D] and the state after the T tokens (None without one)."""
    b, t, _ = x.shape
    x = x * real[..., None].astype(x.dtype)
    mixed = self.in_proj_qkv(x)
    z = self.in_proj_z(x).reshape(b, t, self.hv, self.dv)
    beta = jax.nn.sigmoid(self.in_proj_b(x).astype(jnp.float32))
    a = self.in_proj_a(x).astype(jnp.float32)
    g = -jnp.exp(self.A_log[...].astype(jnp.float32)) * jax.nn.softplus(a + self.dt_bias[...].astype(jnp.float32))
    weight = self.conv1d.weight[...][:, 0, :]
    mixed, conv_state = causal_conv1d(mixed, weight, state=None if state is None else state.conv, segments=segments)
    kd = self.hk * self.dk
    q = mixed[..., :kd].reshape(b, t, self.hk, self.dk)
    k = mixed[..., kd : 2 * kd].reshape(b, t, self.hk, self.dk)
    v = mixed[..., 2 * kd :].reshape(b, t, self.hv, self.dv)
    initial = None if state is None else state.delta
    if t == 1 and state is not None and segments is None:  # a decode step: the recurrence itself
      out, delta = recurrent_gated_delta(q, k, v, g, beta, initial_state=initial)
    else:
      out, delta = chunk_gated_delta(q, k, v, g, beta, initial_state=initial, segments=segments)
    out = gated_rms_norm(out, z, self.norm.weight[...], self.eps)
    out = self.out_proj(out.reshape(b, t, -1))
    return out, (None if state is None else LinearState(conv_state.astype(state.conv.dtype), delta))


class LinearLayer(nnx.Module):
  """A linear-attention layer of the hybrid decoder: zero-centred norms around `GatedDeltaNet` and the MLP."""

  def __init__(self, cfg: Qwen35Config, *, rngs):
    t = cfg.text
    self.input_layernorm = ZeroCenteredRMSNorm(t.hidden_size, t.rms_norm_eps, param_dtype=cfg.param_dtype)
    self.post_attention_layernorm = ZeroCenteredRMSNorm(t.hidden_size, t.rms_norm_eps, param_dtype=cfg.param_dtype)
    self.linear_attn = GatedDeltaNet(cfg, rngs=rngs)
    self.mlp = SwiGLU(
      t.hidden_size, t.intermediate_size, bias=False, dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs
    )

  def __call__(self, x, real, state=None, segments=None):
    h, state = self.linear_attn(self.input_layernorm(x), real, state, segments)
    x = shard(x + h, ("batch", None, None))
    return shard(x + self.mlp(self.post_attention_layernorm(x)), ("batch", None, None)), state
