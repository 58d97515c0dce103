"""How packed rows' text attention runs in a pass without a cache (several sequences per row, segment ids): the one
place choosing it. A fused kernel with segment ids where one applies (`splash` on TPU, `gpu_flash` on GPU: scores
never beyond a tile), else with a segment window `segment_attention`'s blocked jnp attention (T x W scores), else
(None) the caller's dense segment mask (T x T).

Shapes: B rows, T slots, N query heads, K key/value heads, H head dim.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxcap.models import gpu_flash, splash
from jaxcap.models.fused_segments import FusedSegments
from jaxcap.models.segment_attention import SegmentMask, SegmentWindow, segment_attention, segment_mask


def fused_platform() -> str | None:
  """The fused kernel packed rows' attention takes ('tpu': splash, 'gpu': `gpu_flash`), or None (jnp)."""
  return "tpu" if splash.applies() else "gpu" if gpu_flash.applies() else None


def packed_mask(
  segments: jax.Array, attention_mask: jax.Array, window: SegmentWindow | None, parents: jax.Array | None = None
) -> FusedSegments | SegmentMask | None:
  """The mask of packed rows with segment ids `segments` int [B, T] and real tokens `attention_mask` [B, T]
  (others: padding, segment 0), none longer than `window.span` where a window is given: a kernel's
  `FusedSegments`, a `SegmentMask`, or None (dense attention). Built once per pass, read by every layer.
  `parents` int [B, T] (rows whose completions read their group's shared prompt segment): the kernels read
  segment ids only, so such rows take the jnp paths (`jaxcap.train.packing.rows` shares only where none applies)."""
  segments = jnp.where(attention_mask.astype(bool), segments, 0)
  platform = fused_platform() if parents is None else None
  if platform is not None:
    return FusedSegments(segments, platform, window.span if window is not None else None)
  return segment_mask(segments, window, parents) if window is not None else None


def packed_attention(
  q: jax.Array, k: jax.Array, v: jax.Array, mask: FusedSegments | SegmentMask, scale: float
) -> jax.Array:
  """Causal attention of q [B, T, N, H] over k, v [B, T, K, H] within segments, as `mask` says -> [B, T, N, H] (a
  padding query's output is arbitrary, finite)."""
  if isinstance(mask, SegmentMask):
    return segment_attention(q, k, v, mask, scale)
  if mask.platform == "tpu":
    return splash.splash_segment_attention(q, k, v, mask, scale)
  return gpu_flash.flash_segment_attention(q, k, v, mask, scale)
