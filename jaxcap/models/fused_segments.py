"""What the fused attention kernels of packed rows share (`splash` on TPU, `gpu_flash` on GPU): the mask they read,
the platform the program targets, and running a kernel per shard of rows and heads under a mesh.

Shapes: B rows, T slots, N query heads, K key/value heads.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from jaxcap.sharding import MESH_AXES, logical_to_spec


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class FusedSegments:
  """Packed rows' mask for a fused kernel: segment ids int [B, T] (1, 2, ... per contiguous sequence, 0 padding);
  static: `platform`, the kernel's ('tpu': splash, 'gpu': `gpu_flash`), and `span`, the longest segment's bound
  (a `SegmentWindow`'s span) or None (causal over the row)."""

  segments: jax.Array
  platform: str = dataclasses.field(metadata=dict(static=True))
  span: int | None = dataclasses.field(default=None, metadata=dict(static=True))


def target_platform() -> str:
  """The platform the program being traced runs on: the ambient mesh's devices', else the default backend."""
  mesh = jax.sharding.get_abstract_mesh()
  if not mesh.empty:
    return mesh.abstract_device.platform
  return jax.default_backend()


def group_heads(n: int, kv_heads: int, kernel: str) -> int:
  """Query heads per key/value head (GQA), or a ValueError where they do not group."""
  if n % kv_heads:
    raise ValueError(f"{kernel}: {n} query heads are not a multiple of the {kv_heads} key/value heads")
  return n // kv_heads


def pad_slots(x: jax.Array, slots: int) -> jax.Array:
  """x [B, T, ...] zero-padded to [B, slots, ...] (segment ids: 0, padding)."""
  return jnp.pad(x, ((0, 0), (0, slots - x.shape[1])) + ((0, 0),) * (x.ndim - 2))


def per_shard(run: Callable, rows: int, n: int, kv_heads: int, qkv: Callable[[object, object], P]) -> Callable:
  """`run(q, k, v, segments)` as it runs under the ambient mesh: in `shard_map` over the rows (the 'batch' axes)
  and, where the tensor axis divides both head counts, the heads (a query head's group stays on its key/value
  head's shard); unchanged without a (data, fsdp, tensor) mesh of several devices. `qkv(rows_spec, heads_spec)`:
  the kernel's q / k / v partition spec, segment ids int [B, T] split over rows only."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or not set(MESH_AXES) <= set(mesh.axis_names) or mesh.size == 1:
    return run
  row_spec = logical_to_spec(("batch",), (rows,), mesh)[0]
  heads = logical_to_spec(("heads",), (math.gcd(n, kv_heads),), mesh)[0]  # divides both head counts, or none
  spec = qkv(row_spec, heads)
  return jax.shard_map(run, in_specs=(spec, spec, spec, P(row_spec, None)), out_specs=spec, check_vma=False)
