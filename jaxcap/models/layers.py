"""Building blocks shared by the vision tower and the decoder: RMSNorm, SwiGLU MLP, rotary embeddings."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxcap.choices import REMAT_POLICIES
from jaxcap.models import row_blocks


class RMSNorm(nnx.Module):
  """Root-mean-square norm computed in float32, cast back to the input dtype before the gain (as HF does)."""

  def __init__(self, dim: int, eps: float, *, param_dtype=jnp.float32):
    self.weight = nnx.Param(jnp.ones((dim,), param_dtype))
    self.eps = eps

  def __call__(self, x: jax.Array) -> jax.Array:
    dtype = x.dtype
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return self.weight[...].astype(dtype) * x32.astype(dtype)


class LayerNorm(nnx.Module):
  """LayerNorm with gain and bias (HF names `weight` / `bias`), computed in float32, cast back to the input dtype."""

  def __init__(self, dim: int, eps: float, *, param_dtype=jnp.float32):
    self.weight = nnx.Param(jnp.ones((dim,), param_dtype))
    self.bias = nnx.Param(jnp.zeros((dim,), param_dtype))
    self.eps = eps

  def __call__(self, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + self.eps)
    return (y * self.weight[...].astype(jnp.float32) + self.bias[...].astype(jnp.float32)).astype(x.dtype)


class Linear(nnx.Linear):
  """`nnx.Linear` applied to its input flattened to 2-D [rows, in] (same params, same math): XLA:CPU computes the
  kernel gradient of a 3-D input, a dot with two contracting dims, ~1.5x slower than the 2-D one (SwiGLU block
  forward + backward at 1200 x 512 -> 2752: 210 -> 129 ms); elsewhere the reshape is free.

  The kernel is [in, out], or, in a decode loop's copy of the params, in `row_blocks` [C, out / C, in]."""

  def __call__(self, x: jax.Array) -> jax.Array:
    lead = x.shape[:-1]
    x = x.reshape(-1, x.shape[-1])
    if self.kernel.ndim == 2:
      # in the compute dtype: a LoRA delta (float32 adapters, jaxcap.models.lora) would otherwise promote it
      y = super().__call__(x)
      return y.astype(self.dtype or y.dtype).reshape(*lead, -1)
    bias = self.bias[...] if self.bias is not None else None
    x, blocks, bias = self.promote_dtype((x, self.kernel[...], bias), dtype=self.dtype)
    y = row_blocks.matmul(x, blocks, precision=self.precision, preferred_element_type=self.preferred_element_type)
    if bias is not None:
      y += bias
    return y.reshape(*lead, -1)


def linear(din: int, dout: int, *, bias: bool, dtype, param_dtype, rngs: nnx.Rngs) -> Linear:
  """A dense layer with HF's init scale (normal, std 0.02); kernels are [in, out] (HF stores [out, in])."""
  return Linear(
    din, dout, use_bias=bias, dtype=dtype, param_dtype=param_dtype, kernel_init=nnx.initializers.normal(0.02), rngs=rngs
  )


class SwiGLU(nnx.Module):
  """down(silu(gate(x)) * up(x)); the vision tower uses biases, the decoder does not."""

  def __init__(self, dim: int, hidden: int, *, bias: bool, dtype, param_dtype, rngs: nnx.Rngs):
    kw = dict(bias=bias, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.gate_proj = linear(dim, hidden, **kw)
    self.up_proj = linear(dim, hidden, **kw)
    self.down_proj = linear(hidden, dim, **kw)

  def __call__(self, x: jax.Array) -> jax.Array:
    return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


def rotate_half(x: jax.Array) -> jax.Array:
  x1, x2 = jnp.split(x, 2, axis=-1)
  return jnp.concatenate([-x2, x1], axis=-1)


def apply_rotary(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """x: [..., T, heads, head_dim]; cos/sin: [..., T, head_dim] in float32. Rotation in float32."""
  x32 = x.astype(jnp.float32)
  out = x32 * cos[..., None, :] + rotate_half(x32) * sin[..., None, :]
  return out.astype(x.dtype)


def mrope_cos_sin(
  positions: jax.Array, head_dim: int, theta: float, mrope_section: tuple[int, ...], interleaved: bool = False
) -> tuple[jax.Array, jax.Array]:
  """Multimodal RoPE tables.

  positions: int [3, B, T] (temporal, height, width ids). Returns cos, sin: float32 [B, T, head_dim], where
  frequency band i takes its angle from position row i % 3 per `mrope_section` (sums to head_dim // 2): in
  contiguous runs (Qwen2.5-VL), or `interleaved` (Qwen3-VL): bands 1, 4, 7, ... up to 3 x section[1] follow the
  height, bands 2, 5, 8, ... up to 3 x section[2] the width, the rest the temporal id.
  """
  inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  freqs = positions.astype(jnp.float32)[..., None] * inv_freq  # [3, B, T, hd/2]
  if interleaved:
    row = np.zeros(head_dim // 2, np.int32)
    for axis in (1, 2):
      row[axis : 3 * mrope_section[axis] : 3] = axis
    freqs = jnp.where(row == 0, freqs[0], jnp.where(row == 1, freqs[1], freqs[2]))
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)
  bounds = [0]
  for s in mrope_section:
    bounds.append(bounds[-1] + s)
  chunks = [freqs[i % 3, ..., bounds[i] : bounds[i + 1]] for i in range(len(mrope_section))]
  freqs = jnp.concatenate(chunks, axis=-1)
  emb = jnp.concatenate([freqs, freqs], axis=-1)
  return jnp.cos(emb), jnp.sin(emb)


def remat(fn, policy: str):
  """`fn` rematerialised in the backward pass per `policy` ('none' | 'full' | 'dots')."""
  if policy == "none":
    return fn
  if policy not in REMAT_POLICIES:
    raise ValueError(f"remat={policy!r}; choose 'none', 'full' or 'dots'.")
  saveable = None if policy == "full" else jax.checkpoint_policies.dots_with_no_batch_dims_saveable
  return jax.checkpoint(fn, policy=saveable)


def stacked(make, n: int, rngs: nnx.Rngs):
  """`n` independently initialised copies of the module `make(rngs)`, as ONE module whose every param has a
  leading layer axis of size `n`, so the layers can run under `jax.lax.scan` (one compiled body, any depth)."""

  @nnx.split_rngs(splits=n)
  @nnx.vmap(in_axes=(0,), out_axes=0)
  def build(r):
    return make(r)

  return build(rngs)


def scan_layers(
  stack: nnx.Module,
  body,
  carry,
  xs=None,
  *,
  start: int = 0,
  stop: int | None = None,
  policy="none",
  unroll=False,
  per_layer_converts=False,
):
  """Runs layers [start, stop) of a `stacked` module in order: carry = body(layer, carry, x_i) for each layer
  (a Module bound to that layer's params) and its slice x_i of `xs` (a pytree with a leading layer axis, or
  None). The layer call is rematerialised per `policy`; `unroll=True` unrolls the loop in the compiled program
  (same params and results). `per_layer_converts` (with `unroll`): each layer reads its slice
  of the stack with its 16-bit weights tied to the carry (`row_blocks.in_step`), so XLA:CPU converts them to
  float32 as that layer runs, not the whole stack up front (4 bytes per weight of the stack, live for the whole
  program). A scan copies its stacks into the loop's state whatever the tie. Returns the final carry."""
  graphdef, params = nnx.split(stack)
  n = jax.tree.leaves(params)[0].shape[0]
  stop = n if stop is None else stop
  if stop <= start:
    return carry

  @functools.partial(remat, policy=policy)
  def layer_fn(layer_params, carry, x):
    if per_layer_converts:
      layer_params = row_blocks.in_step(layer_params, jax.tree.leaves(carry)[0])
    return body(nnx.merge(graphdef, layer_params), carry, x)

  if unroll and per_layer_converts:
    # each layer reads its slice of the stack itself: XLA:CPU fuses that slice into the layer's float32 convert,
    # where a scan over a sub-range (or a scan's loop state) is a copy of those layers' weights
    for i in range(start, stop):
      x = None if xs is None else jax.tree.map(lambda a, i=i: a[i - start], xs)
      carry = layer_fn(jax.tree.map(lambda a, i=i: a[i], params), carry, x)
    return carry
  part = params if (start, stop) == (0, n) else jax.tree.map(lambda a: a[start:stop], params)

  def step(carry, args):
    layer_params, x = args
    return layer_fn(layer_params, carry, x), None

  carry, _ = jax.lax.scan(step, carry, (part, xs), unroll=unroll)
  return carry
