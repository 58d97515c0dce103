"""torch's antialiased bicubic resize of uint8 images, in numpy, bit-exact: transformers' video processor resizes
frames with `torch.nn.functional.interpolate(..., mode="bicubic", antialias=True)` on uint8 tensors, so video
preprocessing equal to transformers needs the same fixed-point kernel (ATen's UpSampleKernel.cpp)."""

from __future__ import annotations

import math

import numpy as np


def _cubic(x: np.ndarray, a: float = -0.5) -> np.ndarray:
  x = np.abs(x)
  near = ((a + 2) * x - (a + 3)) * x * x + 1
  far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
  return np.where(x < 1, near, np.where(x < 2, far, 0.0))


def _aa_weights(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray, int, int]:
  """First source index int64 [n_out], int16-scaled weights int64 [n_out, taps], their precision (bits) and the
  tap count, as ATen's `_compute_index_ranges_int16_weights` (UpSampleKernel.cpp) computes them in float64."""
  scale = n_in / n_out
  support = 2.0 * scale if scale >= 1 else 2.0  # bicubic: interp_size 4, widened by the scale when shrinking
  invscale = 1 / scale if scale >= 1 else 1.0
  taps = math.ceil(support) * 2 + 1
  center = scale * (np.arange(n_out) + 0.5)
  xmin = np.maximum((center - support + 0.5).astype(np.int64), 0)
  xsize = np.clip(np.minimum((center + support + 0.5).astype(np.int64), n_in) - xmin, 0, taps)
  j = np.arange(taps)
  w = _cubic((j[None] + xmin[:, None] - center[:, None] + 0.5) * invscale)
  w = np.where(j[None] < xsize[:, None], w, 0.0)
  total = w.sum(axis=1, keepdims=True)
  w = np.where(total != 0, w / np.where(total != 0, total, 1), w)
  precision = 0  # the most bits that keep the largest weight within int16
  while precision < 22 and int(0.5 + w.max() * (1 << (precision + 1))) < (1 << 15):
    precision += 1
  v = w * (1 << precision)
  return xmin, np.where(v < 0, np.trunc(v - 0.5), np.trunc(v + 0.5)).astype(np.int64), precision, taps


def _aa_pass(x: np.ndarray, axis: int, n_out: int) -> np.ndarray:
  """Resamples uint8 `x` along `axis` to `n_out` (fixed point, rounded and clamped to uint8 like ATen)."""
  n_in = x.shape[axis]
  if n_in == n_out:
    return x
  xmin, w, precision, taps = _aa_weights(n_in, n_out)
  x = np.moveaxis(x, axis, -1)
  # |sum| <= 255 * 2**precision * ~1.2: int32 cannot overflow for precision <= 22
  acc = np.full(x.shape[:-1] + (n_out,), 1 << (precision - 1), np.int32)
  for j in range(taps):  # zero weights beyond a row's taps; the clipped index keeps the gather in range
    acc += x[..., np.minimum(xmin + j, n_in - 1)].astype(np.int32) * w[:, j].astype(np.int32)
  return np.moveaxis(np.clip(acc >> precision, 0, 255).astype(np.uint8), -1, axis)


def resize_bicubic_aa(frames: np.ndarray, height: int, width: int) -> np.ndarray:
  """uint8 [..., H, W, C] -> uint8 [..., height, width, C], equal to `torch.nn.functional.interpolate(x,
  (height, width), mode="bicubic", antialias=True)` on a uint8 tensor (horizontal pass, then vertical)."""
  if frames.dtype != np.uint8:
    raise ValueError(f"frames of dtype {frames.dtype}; resize_bicubic_aa takes uint8")
  return _aa_pass(_aa_pass(frames, -2, width), -3, height)
