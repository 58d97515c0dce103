"""Weights in row blocks, for matmuls with few rows (a decode step's) on XLA:CPU.

A weight W [in, out] in row blocks is W's transpose cut into C equal blocks of output rows: [C, out / C, in].
x [M, in] @ W is then one batched dot over the blocks (`matmul`): the same products, which XLA may sum in another
order, so outputs equal x @ W within float rounding (bitwise at some shapes, not all).

Why: XLA:CPU's GEMM (YNNPACK in jaxlib 0.10) packs the weight operand afresh at every call, so a matmul with few
rows streams the weight ~3x and runs far below both the GEMM ceiling and memory bandwidth. With the weight
as [out, in] blocks of ~256 rows, each block is packed while it is in cache. Measured on a 2-core AMD EPYC
(f32, min of interleaved calls; docs/benchmarks-history.md): one decode step of a 4-layer Qwen2.5-VL-3B decoder with its
151936-token tied head, 1024 cache slots, through the model's code: 8 rows 2.28x, 32 rows 1.69x, 64 rows 1.22x,
128 rows 1.08x; 7B (untied head), 32 rows 2.12x. The `mid()` model's decode-step matmuls: 32 rows 1.5x, 64 rows
1.08x, 128 rows 0.96x; hence rows <= 64. bfloat16 (3B shapes, 8-32 rows): 1.2-1.34x; mid shapes 0.9x.

Only on CPU and unsharded: GPU/TPU GEMMs take either layout, and a sharded weight would be re-laid across
devices. The caller decides once, outside its decode loop (`applies`), since the transpose is a copy of the
weight (it replaces the per-layer slices of the layer stack, which are copies too).

XLA:CPU computes a bfloat16 dot in float32, converting its weight operand. A weight that depends only on the
loop's invariant params gets that convert scheduled up front (or hoisted out of the loop), so every layer's float32
copy is live at once: 4 bytes per bfloat16 weight on top of the 2 held. `in_step` ties such weights to the
step's activations, so each layer's convert runs when that layer does and its buffer is reused by the next.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

MAX_ROWS = 64  # above this the plain [in, out] dot is as fast or faster (measured 0.96x at 128 rows)
BLOCK_ROWS = 256  # weight rows per block (128-256 measured best at 32 rows; 64-1000 all within ~10%)


def applies(rows: int) -> bool:
  """Whether a loop of matmuls with `rows` rows should take its weights in row blocks: few rows, on CPU (the
  ambient mesh's devices, e.g. a TPU topology compiled ahead of time from a CPU host, else the default backend),
  and no multi-device mesh."""
  mesh = jax.sharding.get_abstract_mesh()
  return rows <= MAX_ROWS and on_cpu() and (mesh.empty or mesh.size == 1)


def on_cpu() -> bool:
  """Whether programs traced now run on CPU (the ambient mesh's devices, else the default backend)."""
  mesh = jax.sharding.get_abstract_mesh()
  device = None if mesh.empty else getattr(mesh, "abstract_device", None)
  return (device.platform if device is not None else jax.default_backend()) == "cpu"


def in_step(tree, x: jax.Array):
  """`tree` (a layer's params) read in a step whose activations are `x`: on CPU, each 16-bit float leaf of 2+ dims
  gets an exact zero computed from `x` added to its bits, so XLA:CPU's float32 convert of it depends on the step
  and runs where the layer runs, reusing one buffer, instead of every layer's converts made up front. (An integer
  add: a bf16 add XLA:CPU would itself upcast, converting the invariant weight first.) Differentiable: the
  identity in each weight. Off CPU, as it is."""
  if not on_cpu():
    return tree
  s = x.reshape(-1)[0].astype(jnp.float32)
  zero = jnp.where(jnp.isfinite(s), s * 0, 0).astype(jnp.uint16)  # 0, and XLA cannot prove it

  def tie(w):
    if not (jnp.issubdtype(w.dtype, jnp.floating) and jnp.dtype(w.dtype).itemsize == 2 and w.ndim >= 2):
      return w
    return _tied(w, zero)

  return jax.tree.map(tie, tree)


@jax.custom_jvp
def _tied(w: jax.Array, zero: jax.Array) -> jax.Array:
  """w with the integer `zero` added to its bits: w's value, computed after `zero`."""
  return jax.lax.bitcast_convert_type(jax.lax.bitcast_convert_type(w, jnp.uint16) + zero, w.dtype)


@_tied.defjvp
def _tied_jvp(primals, tangents):
  # the identity in w (a bit cast has no derivative of its own: w's gradient would be silently zero)
  return _tied(*primals), tangents[0]


def block_count(out: int, rows: int = BLOCK_ROWS) -> int:
  """The number of equal blocks of an `out`-row weight whose block height is nearest to `rows`."""
  divisors = {d for i in range(1, math.isqrt(out) + 1) if out % i == 0 for d in (i, out // i)}
  return min(divisors, key=lambda c: (abs(out // c - rows), c))


def from_rows(w: jax.Array) -> jax.Array:
  """A weight laid out [out, in] (e.g. a tied embedding [V, D]) -> row blocks [C, out / C, in]: a reshape."""
  out, din = w.shape
  c = block_count(out)
  return w.reshape(c, out // c, din)


def from_kernel(kernel: jax.Array) -> jax.Array:
  """A kernel [in, out] -> row blocks [C, out / C, in] (a transposed copy)."""
  return from_rows(kernel.T)


def matmul(x: jax.Array, blocks: jax.Array, *, precision=None, preferred_element_type=None) -> jax.Array:
  """x [M, in] @ the weight in row `blocks` [C, n, in] -> [M, C * n]."""
  c, n, _ = blocks.shape
  y = jnp.einsum("mk,cnk->cmn", x, blocks, precision=precision, preferred_element_type=preferred_element_type)
  return y.transpose(1, 0, 2).reshape(x.shape[0], c * n)
