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

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from jaxcap.models.fused_segments import FusedSegments, group_heads, pad_slots, per_shard, target_platform

LANES = 128  # the kernel's block sizes are multiples of this
BLOCKS = (512, 256, 128)  # preferred block sizes, largest first (maxtext's default is 512)
INTERPRET = False  # tests: Pallas interpret mode (CPU), and `applies` on any backend


def applies() -> bool:
  """Whether packed rows' attention goes through splash attention (TPU targets; any backend under `INTERPRET`)."""
  return INTERPRET or target_platform() == "tpu"


def splash_segment_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: FusedSegments, scale: float) -> jax.Array:
  """Causal attention of q [B, T, N, H] over k, v [B, T, K, H] within segments (`mask`) -> [B, T, N, H]. A padding
  query's output (segment 0) is arbitrary (finite) and must not be read."""
  b, t, n, h = q.shape
  group_heads(n, k.shape[2], "splash attention")
  padded = math.ceil(t / LANES) * LANES
  # the scale on the queries (the kernel has none), in float32 before the cast back
  q = pad_slots((q.astype(jnp.float32) * scale).astype(q.dtype), padded).transpose(0, 2, 1, 3)  # [B, N, T', H]
  k, v = (pad_slots(x.astype(q.dtype), padded).transpose(0, 2, 1, 3) for x in (k, v))  # [B, K, T', H]
  segments = pad_slots(mask.segments.astype(jnp.int32), padded)  # padding slots: segment 0
  run = functools.partial(_attend, span=mask.span, interpret=INTERPRET or target_platform() != "tpu")
  out = per_shard(run, b, n, k.shape[1], lambda rows, heads: P(rows, heads, None, None))(q, k, v, segments)
  return out.transpose(0, 2, 1, 3)[:, :t]


def _attend(q: jax.Array, k: jax.Array, v: jax.Array, segments: jax.Array, *, span, interpret) -> jax.Array:
  """One shard: q [b, n, T', H], k, v [b, k, T', H], segments int [b, T'] -> [b, n, T', H]."""
  from jax.experimental.pallas.ops.tpu import splash_attention as splash  # Pallas TPU (~0.1 s): where it runs

  _, n, t, _ = q.shape
  if span is None or span >= t:
    head_mask = splash.CausalMask((t, t))
  else:  # causal within the span: key blocks wholly before it are skipped
    head_mask = splash.LocalMask((t, t), window_size=(span - 1, 0), offset=0)
  return _run_vmapped(head_mask, n, q, k, v, segments, segments, interpret)


def _run_vmapped(head_mask, n: int, q, k, v, q_segments, kv_segments, interpret: bool):
  """`head_mask` (a splash mask of [Tq, Tk]) for each of `n` heads, the largest `BLOCKS` dividing Tq and Tk, vmapped
  over the shard's rows: q [b, n, Tq, H], k, v [b, K, Tk, H], segment ids [b, Tq] / [b, Tk] -> [b, n, Tq, H]."""
  from jax.experimental.pallas.ops.tpu import splash_attention as splash

  bq, bkv = (next(c for c in BLOCKS if x.shape[2] % c == 0) for x in (q, k))
  sizes = dict(block_q=bq, block_kv=bkv, block_kv_compute=bkv, block_q_dkv=bq, block_kv_dkv=bkv)
  sizes.update(block_kv_dkv_compute=bkv, block_q_dq=bq, block_kv_dq=bkv)
  kernel = splash.make_splash_mha(
    splash.MultiHeadMask([head_mask] * n),
    block_sizes=splash.BlockSizes(**sizes),
    head_shards=1,
    q_seq_shards=1,
    interpret=interpret,
  )
  ids = splash.SegmentIds(q=q_segments, kv=kv_segments)
  return jax.vmap(kernel, in_axes=(0, 0, 0, splash.SegmentIds(q=0, kv=0)))(q, k, v, ids)


def group_attention(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  prompt_k: jax.Array,
  prompt_v: jax.Array,
  prompt_mask: jax.Array,
  scale: float,
) -> jax.Array:
  """`group_attention.group_attention` through splash: one row per prompt, its G completions' queries [G * C]
  against keys [prompt | G completions]; a static mask (every query sees the prompt's slots, its own completion's
  causally, no other completion's: their key blocks are skipped), kv segment ids keeping the prompt's padding out.
  q [N, C, NH, H], k, v [N, C, K, H], prompt_k, prompt_v [B, P, K, H], prompt_mask [B, P] -> [N, C, NH, H]."""
  n, c, nh, h = q.shape
  b, p = prompt_mask.shape
  g, kh = n // b, k.shape[2]
  group_heads(nh, kh, "splash attention")
  tq, tk = math.ceil(g * c / LANES) * LANES, math.ceil((p + g * c) / LANES) * LANES
  q = (q.astype(jnp.float32) * scale).astype(q.dtype).reshape(b, g * c, nh, h)
  q = pad_slots(q, tq).transpose(0, 2, 1, 3)  # [B, NH, Tq, H]
  keys = lambda prompt, own: pad_slots(
    jnp.concatenate([prompt.astype(q.dtype), own.astype(q.dtype).reshape(b, g * c, kh, h)], axis=1), tk
  ).transpose(0, 2, 1, 3)  # [B, K, Tk, H]
  # kv segments: the prompt's real tokens and the completions 1, padding 0; every query is segment 1 (a padding
  # query reads every real key: finite, never read)
  real = jnp.concatenate([prompt_mask.astype(jnp.int32), jnp.ones((b, g * c), jnp.int32)], axis=1)
  segments = pad_slots(real, tk)
  run = functools.partial(_attend_group, shape=(p, g, c), interpret=INTERPRET or target_platform() != "tpu")
  out = per_shard(run, b, nh, kh, lambda rows, heads: P(rows, heads, None, None))(
    q, keys(prompt_k, k), keys(prompt_v, v), segments
  )
  return out.transpose(0, 2, 1, 3)[:, : g * c].reshape(n, c, nh, h)


def group_mask(p: int, g: int, c: int, tq: int, tk: int) -> np.ndarray:
  """The static mask bool [tq, tk] of `group_attention`'s rows: query slot a < G * C (completion a // C, position
  a % C) sees key slots < p (the prompt) and key slot p + j of the same completion at a position <= its own;
  padding queries see every key (the segment ids then keep them to real ones)."""
  a, j = np.arange(tq)[:, None], np.arange(tk)[None, :]
  own = (j >= p) & (j < p + g * c) & ((j - p) // c == a // c) & ((j - p) % c <= a % c)
  return (j < p) | own | (a >= g * c)


def _attend_group(q, k, v, segments, *, shape, interpret):
  """One shard: q [b, NH, Tq, H], k, v [b, K, Tk, H], kv segments int [b, Tk] -> [b, NH, Tq, H]."""
  from jax.experimental.pallas.ops.tpu import splash_attention as splash  # Pallas TPU: where it runs

  _, n, tq, _ = q.shape
  tk = k.shape[2]
  head_mask = splash.NumpyMask(group_mask(*shape, tq, tk))
  return _run_vmapped(head_mask, n, q, k, v, jnp.ones(segments.shape[:1] + (tq,), jnp.int32), segments, interpret)
