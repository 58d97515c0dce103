"""Causal attention within the segments of packed rows through splash attention, the Pallas TPU kernel maxtext uses
(`jax.experimental.pallas.ops.tpu.splash_attention`): on TPU the packed passes' text attention never materialises
scores beyond one [block_q, block_kv] tile, where `segment_attention` / the dense segment mask hold T x W or T x T.

The kernel's static mask is causal (`CausalMask`) or, with a segment window, causal within the window's span
(`LocalMask` of span - 1 keys to the left: the band `segment_attention` reads, so the kernel skips the key blocks
beyond it); `SegmentIds` keep a query within its own segment. A padding slot (segment 0) sees the padding before it
and itself (a row of the kernel's mask is never empty), a real token never sees padding: the dense segment mask's
attention (`segment_attention.dense_segment_mask`) at every real token. GQA: the kernel reads query head n against
key/value head n // (N / K), `cached_attention`'s grouping. The softmax scale is applied to the queries.

Chosen (`applies`) where the programs target TPU: the ambient mesh's platform (`jax.set_mesh`; `jaxcap.plan`'s
TPU topologies on a CPU host too), else the default backend. Under a mesh the kernel runs in `shard_map` over the
rows (the 'batch' axes) and, where the tensor axis divides both head counts, the heads; per shard it is vmapped
over rows. `INTERPRET` (tests) runs it in Pallas interpret mode on CPU and dispatches to it there.

Shapes: B rows, T slots (padded here to a multiple of 128, the kernel's lane width), N query heads, K key/value
heads, H head dim.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from jaxcap.sharding import MESH_AXES, logical_to_spec

LANES = 128  # the kernel's block sizes are multiples of this
BLOCKS = (512, 256, 128)  # preferred block sizes, largest first (maxtext's default is 512)
INTERPRET = False  # tests: Pallas interpret mode (CPU), and `applies` on any backend


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SplashSegments:
  """Packed rows' mask for splash attention: segment ids int [B, T] (1, 2, ... per contiguous sequence, 0 padding);
  `span` static: the longest segment's bound (a `SegmentWindow`'s span) or None (causal over the row)."""

  segments: jax.Array
  span: int | None = dataclasses.field(default=None, metadata=dict(static=True))


def target_platform() -> str:
  """The platform the program being traced runs on: the ambient mesh's devices', else the default backend."""
  mesh = jax.sharding.get_abstract_mesh()
  if not mesh.empty:
    return mesh.abstract_device.platform
  return jax.default_backend()


def applies() -> bool:
  """Whether packed rows' attention goes through splash attention (TPU targets; any backend under `INTERPRET`)."""
  return INTERPRET or target_platform() == "tpu"


def splash_segment_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: SplashSegments, scale: float) -> jax.Array:
  """Causal attention of q [B, T, N, H] over k, v [B, T, K, H] within segments (`mask`) -> [B, T, N, H]. A padding
  query's output (segment 0) is arbitrary (finite) and must not be read."""
  b, t, n, h = q.shape
  kv_heads = k.shape[2]
  if n % kv_heads:
    raise ValueError(f"splash attention: {n} query heads are not a multiple of the {kv_heads} key/value heads")
  padded = math.ceil(t / LANES) * LANES
  pad = lambda x: jnp.pad(x, ((0, 0), (0, padded - t)) + ((0, 0),) * (x.ndim - 2))
  # the scale on the queries (the kernel has none), in float32 before the cast back
  q = pad((q.astype(jnp.float32) * scale).astype(q.dtype)).transpose(0, 2, 1, 3)  # [B, N, T', H]
  k, v = (pad(x.astype(q.dtype)).transpose(0, 2, 1, 3) for x in (k, v))  # [B, K, T', H]
  segments = pad(mask.segments.astype(jnp.int32))  # padding slots: segment 0
  run = functools.partial(_attend, span=mask.span, interpret=INTERPRET or target_platform() != "tpu")
  mesh = jax.sharding.get_abstract_mesh()
  if not mesh.empty and set(MESH_AXES) <= set(mesh.axis_names) and mesh.size > 1:
    rows = logical_to_spec(("batch",), (b,), mesh)[0]
    heads = logical_to_spec(("heads",), (math.gcd(n, kv_heads),), mesh)[0]  # divides both head counts, or none
    qkv, seg = P(rows, heads, None, None), P(rows, None)
    run = jax.shard_map(run, in_specs=(qkv, qkv, qkv, seg), out_specs=qkv, check_vma=False)
  out = run(q, k, v, segments)
  return out.transpose(0, 2, 1, 3)[:, :t]


def _attend(q: jax.Array, k: jax.Array, v: jax.Array, segments: jax.Array, *, span, interpret) -> jax.Array:
  """One shard: q [b, n, T', H], k, v [b, k, T', H], segments int [b, T'] -> [b, n, T', H]."""
  from jax.experimental.pallas.ops.tpu import splash_attention as splash  # Pallas TPU (~0.1 s): where it runs

  _, n, t, _ = q.shape
  if span is None or span >= t:
    head_mask = splash.CausalMask((t, t))
  else:  # causal within the span: key blocks wholly before it are skipped
    head_mask = splash.LocalMask((t, t), window_size=(span - 1, 0), offset=0)
  block = next(c for c in BLOCKS if t % c == 0)
  sizes = dict(block_q=block, block_kv=block, block_kv_compute=block)
  sizes.update(block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
  kernel = splash.make_splash_mha(
    splash.MultiHeadMask([head_mask] * n),
    block_sizes=splash.BlockSizes(**sizes),
    head_shards=1,
    q_seq_shards=1,
    interpret=interpret,
  )
  ids = splash.SegmentIds(q=segments, kv=segments)
  return jax.vmap(kernel, in_axes=(0, 0, 0, splash.SegmentIds(q=0, kv=0)))(q, k, v, ids)
