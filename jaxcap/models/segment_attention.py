"""Causal attention within the segments of packed rows (several sequences end to end per row, `jaxcap.train.packing.rows`)
at a cost that follows the segments, not the row length.

In a row of T slots whose segments (contiguous, each attended causally within itself only) are at most `span`
tokens long, a query at slot q reads keys in [q - span + 1, q] and no others. A `SegmentWindow` cuts the row into
query blocks of C slots, each read against a window of `blocks` key blocks ending with its own (those holding the
span - 1 slots before its first query, and its own): T x W scores instead of T x T (a banded, block-sparse mask,
as splash attention's local masks). `segment_attention` computes every block's attention at once, with the math
of `jax.nn.dot_product_attention`'s XLA path (`cache_attention.cached_attention`: float32 scores and softmax), so
a query's output is the dense segment-masked attention's (`dense_segment_mask`) up to float summation order: its
softmax and products run over fewer masked-out keys, whose weights are exactly 0 in both.

The window is static (part of the compiled program): `segment_window` puts it on a ladder of sizes, so a stream
of steps compiles few programs, and gives None (dense attention) where it would cover the row.

Shapes: B rows, T slots, N query heads, K key/value heads, H head dim, C block slots, W = blocks x C window slots.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from jaxcap.buckets import ladder
from jaxcap.models.cache_attention import cached_attention

BLOCK = 32  # query slots per block: 16 reads fewer masked keys but ran slower (smaller dots) on XLA:CPU
WINDOW_STEPS = 4  # sizes per octave of the window ladder (in blocks): fewer programs vs fewer masked keys read


@dataclasses.dataclass(frozen=True)
class SegmentWindow:
  """Static: query blocks of `block` slots, each reading `blocks` key blocks ending with its own; it holds rows
  whose segments are at most `span` tokens long."""

  block: int
  blocks: int

  @property
  def span(self) -> int:
    return (self.blocks - 1) * self.block + 1


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SegmentMask:
  """Packed rows' attention mask in query blocks: allowed bool [B * T / C, 1, C, W], key w of block i's window
  (slot (i - blocks + 1) * C + w) visible to its query a (slot i * C + a); `window` static."""

  allowed: jax.Array
  window: SegmentWindow = dataclasses.field(metadata=dict(static=True))


def segment_window(longest: int, row_len: int, block: int | None = None) -> SegmentWindow | None:
  """The window of rows of `row_len` slots whose longest segment is `longest` tokens, in query blocks of `block`
  slots (default `BLOCK`): its own block and those holding the longest - 1 slots before its first query, up a
  ladder (`WINDOW_STEPS` sizes per octave); None where it would cover the row (dense attention reads no more)."""
  block = block or BLOCK
  blocks = ladder(math.ceil((max(1, longest) - 1) / block) + 1, 1, WINDOW_STEPS)
  return None if blocks >= math.ceil(row_len / block) else SegmentWindow(block, blocks)


def readable(seg_q: jax.Array, seg_k: jax.Array, parent_q: jax.Array | None) -> jax.Array:
  """Whether a query of segment `seg_q` may read a key of segment `seg_k` (position aside): the same segment, or
  the query's parent segment `parent_q` (a completion reading its group's shared prompt, `jaxcap.train.packing.rows`);
  never padding (0). Arrays broadcast against each other."""
  same = seg_q == seg_k
  if parent_q is not None:
    same = same | (parent_q == seg_k)
  return same & (seg_k > 0)


def dense_segment_mask(segments: jax.Array, parents: jax.Array | None = None) -> jax.Array:
  """The dense mask bool [B, 1, T, T] of segment ids `segments` int [B, T]: key j visible to query i iff j <= i, j
  in i's segment (or in its parent segment, `parents` int [B, T]) and not padding (0)."""
  t = segments.shape[-1]
  causal = jnp.arange(t)[None, :] <= jnp.arange(t)[:, None]
  parent_q = None if parents is None else parents[:, :, None]
  return (causal[None] & readable(segments[:, :, None], segments[:, None, :], parent_q))[:, None]


def segment_mask(segments: jax.Array, window: SegmentWindow, parents: jax.Array | None = None) -> SegmentMask:
  """The blocked mask of rows with segment ids `segments` int [B, T] (1, 2, ... per contiguous sequence, 0 padding)
  none longer than `window.span` (a segment read through `parents` counted from its parent's first slot). Built
  once per forward pass and read by every layer."""
  b, t = segments.shape
  c, m = window.block, window.blocks
  nb = math.ceil(t / c)
  front = (m - 1) * c
  seg = jnp.pad(segments, ((0, 0), (0, nb * c - t)))
  seg_k = _windows(jnp.pad(seg, ((0, 0), (front, 0))).reshape(b, nb + m - 1, c), nb, m, 1, 2)  # [B, nb, W]
  seg_q = seg.reshape(b, nb, c)
  parent_q = None if parents is None else jnp.pad(parents, ((0, 0), (0, nb * c - t))).reshape(b, nb, c)[..., None]
  causal = jnp.arange(m * c)[None, :] - front <= jnp.arange(c)[:, None]  # [C, W]
  allowed = causal & readable(seg_q[..., :, None], seg_k[..., None, :], parent_q)
  return SegmentMask(allowed.reshape(b * nb, 1, c, m * c), window)


def segment_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: SegmentMask, scale: float) -> jax.Array:
  """Causal attention of q [B, T, N, H] over k, v [B, T, K, H] within segments, per `mask` -> [B, T, N, H]. A
  padding query (segment 0) reads no key: its output is arbitrary (finite) and must not be read."""
  b, t, n, h = q.shape
  kv_heads = k.shape[2]
  c, m = mask.window.block, mask.window.blocks
  nb = math.ceil(t / c)
  front, tail = (m - 1) * c, nb * c - t
  # each block's keys [K, H, W] and values [K, W, H] laid out as a KV cache (XLA:CPU's faster layout), from m - 1
  # blocks of padding in front: query block i reads key blocks i .. i + m - 1 of the padded row
  keys = jnp.pad(k.transpose(0, 2, 3, 1), ((0, 0), (0, 0), (0, 0), (front, tail))).reshape(b, kv_heads, h, -1, c)
  keys = _windows(keys, nb, m, 3, 4).transpose(0, 3, 1, 2, 4).reshape(b * nb, kv_heads, h, m * c)
  values = jnp.pad(v.transpose(0, 2, 1, 3), ((0, 0), (0, 0), (front, tail), (0, 0))).reshape(b, kv_heads, -1, c, h)
  values = _windows(values, nb, m, 2, 3).transpose(0, 2, 1, 3, 4).reshape(b * nb, kv_heads, m * c, h)
  queries = jnp.pad(q, ((0, 0), (0, tail), (0, 0), (0, 0))).reshape(b * nb, c, n, h)
  out = cached_attention(queries, keys, values, mask.allowed, scale)
  return out.reshape(b, nb * c, n, h)[:, :t]


def _windows(x: jax.Array, nb: int, m: int, block_axis: int, slot_axis: int) -> jax.Array:
  """x with nb + m - 1 blocks on `block_axis` and a block's slots on `slot_axis` -> nb windows: block i followed by
  blocks i + 1 .. i + m - 1, their slots end to end on `slot_axis` (m x the slots)."""
  take = lambda j: jax.lax.slice_in_dim(x, j, j + nb, axis=block_axis)
  return jnp.concatenate([take(j) for j in range(m)], axis=slot_axis)
