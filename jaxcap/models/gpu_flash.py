"""Causal attention within the segments of packed rows through JAX's Pallas flash attention for GPU
(`jax.experimental.pallas.ops.gpu.attention.mha`, lowered to Triton, with its own Pallas backward): on GPU the packed
passes' text attention never materialises scores beyond one [block_q, block_k] tile, where `segment_attention` /
the dense segment mask hold T x W or T x T. (`jax.nn.dot_product_attention`'s cuDNN path takes no segment ids.)

The kernel's mask is causal and segment ids equal: a padding slot (segment 0) sees the padding before it and itself
(a row of its mask is never empty), a real token never sees padding or another segment: the dense segment mask's
attention (`segment_attention.dense_segment_mask`) at every real token. A `SegmentWindow`'s span is not read:
causal within the segment is exact, the kernel just visits the key blocks before the span too (the forward stops at
the diagonal block, not before the segment's first one). GQA: the kernel takes as many key/value heads as query
heads, so each key/value head is repeated for its N / K query heads (`cached_attention`'s grouping: query head n
reads key/value head n // (N / K)); the repeat's transpose sums the group's gradients. The softmax scale is the
kernel's `sm_scale` (applied to the float32 scores).

Constraints of the kernel, handled here: the slots are a multiple of the forward block (`BLOCK`, both tiles) and
the backward's (`BACKWARD_BLOCK`): rows are padded to a multiple of `BLOCK`, or a row shorter than that to the
next power of two (at least 16: Triton's tile sizes are powers of two, its dots at least 16 wide); padding slots
get segment 0. The head dim is rounded up to a power of two inside the kernel (masked loads); Triton's dots need
it at least 16 (Qwen's is 128). Block sizes are the kernel's defaults, not tuned here.

Chosen (`applies`) where the programs target GPU: the ambient mesh's platform, else the default backend. Under a
mesh the kernel runs in `shard_map` over the rows and, where the tensor axis divides both head counts, the heads
(`fused_segments.per_shard`). `INTERPRET` (tests) runs it in Pallas interpret mode on CPU and dispatches to it
there.

Shapes: B rows, T slots, N query heads, K key/value heads, H head dim.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from jaxcap.models.fused_segments import FusedSegments, group_heads, pad_slots, per_shard, target_platform

BLOCK = 128  # the forward kernel's query and key tiles (its default)
BACKWARD_BLOCK = 32  # the backward kernels' tiles (its default); divides BLOCK
INTERPRET = False  # tests: Pallas interpret mode (CPU), and `applies` on any backend


def applies() -> bool:
  """Whether packed rows' attention goes through this kernel (GPU targets; any backend under `INTERPRET`)."""
  return INTERPRET or target_platform() == "gpu"


def slots(t: int) -> int:
  """The kernel's slots for rows of t: a multiple of `BLOCK`, or the next power of two (>= 16) below it."""
  return math.ceil(t / BLOCK) * BLOCK if t > BLOCK else max(16, 1 << (t - 1).bit_length())


def flash_segment_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: FusedSegments, scale: float) -> jax.Array:
  """Causal attention of q [B, T, N, H] over k, v [B, T, K, H] within segments (`mask`; its span unread) ->
  [B, T, N, H]. A padding query's output (segment 0) is arbitrary (finite) and must not be read."""
  b, t, n, _ = q.shape
  group_heads(n, k.shape[2], "GPU flash attention")
  padded = slots(t)
  q, k, v = (pad_slots(x, padded) for x in (q, k, v))
  segments = pad_slots(mask.segments.astype(jnp.int32), padded)  # padding slots: segment 0
  run = functools.partial(_attend, scale=scale, interpret=INTERPRET or target_platform() != "gpu")
  out = per_shard(run, b, n, k.shape[2], lambda rows, heads: P(rows, None, heads, None))(q, k, v, segments)
  return out[:, :t]


def _attend(q: jax.Array, k: jax.Array, v: jax.Array, segments: jax.Array, *, scale, interpret) -> jax.Array:
  """One shard: q [b, T', n, H], k, v [b, T', k, H], segments int [b, T'] -> [b, T', n, H]."""
  from jax.experimental.pallas.ops.gpu import attention  # Pallas Triton: imported where it runs

  group = q.shape[2] // k.shape[2]
  k, v = (jnp.repeat(x, group, axis=2) for x in (k, v))  # [b, T', n, H]: head n reads key/value head n // group
  block = min(BLOCK, q.shape[1])
  back = min(BACKWARD_BLOCK, block)
  sizes = attention.BlockSizes(
    block_q=block, block_k=block, block_q_dkv=back, block_kv_dkv=back, block_q_dq=back, block_kv_dq=back
  )
  return attention.mha(q, k, v, segments, sm_scale=scale, causal=True, block_sizes=sizes, interpret=interpret)
