"""Hand-built packed rows for the segment-attention tests: segment ids from per-row lengths, and random q / k / v."""

import jax.numpy as jnp
import numpy as np


def segments(rows, t: int):
  """int32 [len(rows), t]: each row's segments (lengths end to end from slot 0) numbered 1, 2, ...; 0 after them."""
  seg = np.zeros((len(rows), t), np.int32)
  for r, lengths in enumerate(rows):
    ends = np.cumsum(lengths)
    for i, (start, end) in enumerate(zip(ends - lengths, ends)):
      seg[r, start:end] = i + 1
  return jnp.asarray(seg)


def qkv(b: int, t: int, n: int, k: int, h: int, seed: int = 0):
  """float32 q [b, t, n, h], k and v [b, t, k, h] drawn from a standard normal."""
  rng = np.random.default_rng(seed)
  make = lambda heads: jnp.asarray(rng.normal(size=(b, t, heads, h)).astype(np.float32))
  return make(n), make(k), make(k)
