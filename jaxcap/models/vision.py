"""The Qwen2.5-VL vision tower: patch embedding, 2D RoPE, window / full attention blocks, patch merger.

Its inputs' host-computed layouts (window permutation, attention blocks, rotary positions) are built in
`vision_layout` (re-exported here).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxcap.models.config import VisionConfig
from jaxcap.models.layers import RMSNorm, SwiGLU, apply_rotary, linear, scan_layers, stacked
from jaxcap.models.vision_layout import (
  AttentionBlocks,
  LayoutShape,
  VisionLayout,
  layout_shape,
  stack_layouts,
  vision_layout,
)

# the layouts, long imported from here
__all__ = [
  "AttentionBlocks",
  "LayoutShape",
  "VisionAttention",
  "VisionBlock",
  "VisionLayout",
  "VisionTower",
  "PatchMerger",
  "axial_rotary",
  "block_schedule",
  "layout_shape",
  "stack_layouts",
  "vision_layout",
]


def _blocked_attention(q, k, v, blocks: AttentionBlocks, scale: float) -> jax.Array:
  """Bidirectional attention inside each segment. q/k/v: segments [S, Lmax, heads, hd] -> the same."""
  mask = None if blocks.tiled else blocks.valid[:, None, None, :]  # keys only; padded query rows are never read
  return jax.nn.dot_product_attention(q, k, v, mask=mask, scale=scale)


def axial_rotary(rotary_pos: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
  """Axial 2D RoPE tables cos, sin float32 [L, head_dim] of patches at (row, column) `rotary_pos` int [L, 2]: the
  first half of the rotated dims follow the row, the second the column."""
  half = head_dim // 2
  inv_freq = 1.0 / (theta ** (jnp.arange(0, half, 2, dtype=jnp.float32) / half))
  freqs = rotary_pos.astype(jnp.float32)[..., None] * inv_freq  # [L, 2, half/2]
  freqs = freqs.reshape(freqs.shape[0], -1)
  emb = jnp.concatenate([freqs, freqs], axis=-1)
  return jnp.cos(emb), jnp.sin(emb)


class VisionAttention(nnx.Module):
  def __init__(self, cfg: VisionConfig, *, dtype, param_dtype, rngs):
    self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
    self.qkv = linear(cfg.hidden_size, 3 * cfg.hidden_size, bias=True, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.proj = linear(cfg.hidden_size, cfg.hidden_size, bias=True, dtype=dtype, param_dtype=param_dtype, rngs=rngs)

  def __call__(self, x, cos, sin, blocks: AttentionBlocks):
    """x [L, D]; cos / sin: the rotary tables [L, hd], or already split into `blocks` [S, Lmax, hd] (the tower
    splits them once per call, not once per block)."""
    if cos.ndim == 2:
      cos, sin = blocks.split(cos), blocks.split(sin)
    # q, k and v cut into segments in one gather (and one scatter back), rotated there: the same elementwise math
    qkv = blocks.split(self.qkv(x))  # [S, Lmax, 3 D]
    qkv = qkv.reshape(*qkv.shape[:2], 3, self.num_heads, self.head_dim)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    out = blocks.join(_blocked_attention(q, k, v, blocks, self.head_dim**-0.5))
    return self.proj(out.reshape(x.shape[0], -1))


class VisionBlock(nnx.Module):
  def __init__(self, cfg: VisionConfig, *, dtype, param_dtype, rngs):
    self.norm1 = RMSNorm(cfg.hidden_size, 1e-6, param_dtype=param_dtype)
    self.norm2 = RMSNorm(cfg.hidden_size, 1e-6, param_dtype=param_dtype)
    self.attn = VisionAttention(cfg, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.mlp = SwiGLU(
      cfg.hidden_size, cfg.intermediate_size, bias=True, dtype=dtype, param_dtype=param_dtype, rngs=rngs
    )

  def __call__(self, x, cos, sin, blocks: AttentionBlocks):
    x = x + self.attn(self.norm1(x), cos, sin, blocks)
    return x + self.mlp(self.norm2(x))


class PatchMerger(nnx.Module):
  """RMSNorm, then each 2x2 group of patches concatenated and projected to the LM width by a GELU MLP."""

  def __init__(self, cfg: VisionConfig, *, dtype, param_dtype, rngs):
    self.unit_dim = cfg.hidden_size * cfg.spatial_merge_size**2
    self.ln_q = RMSNorm(cfg.hidden_size, 1e-6, param_dtype=param_dtype)
    kw = dict(bias=True, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.fc1 = linear(self.unit_dim, self.unit_dim, **kw)
    self.fc2 = linear(self.unit_dim, cfg.out_hidden_size, **kw)

  def __call__(self, x):
    x = self.ln_q(x).reshape(-1, self.unit_dim)
    return self.fc2(jax.nn.gelu(self.fc1(x), approximate=False))


class VisionTower(nnx.Module):
  """pixel patches [L, patch_dim] + layout -> merged visual tokens [L / merge^2, out_hidden_size]."""

  def __init__(
    self,
    cfg: VisionConfig,
    *,
    dtype=jnp.float32,
    param_dtype=jnp.float32,
    remat: str = "none",
    unroll: bool = False,
    rngs: nnx.Rngs,
  ):
    self.cfg = cfg
    self.remat = remat
    self.unroll = unroll  # unroll the block scans in the compiled program (see Qwen25VLConfig.scan_layers)
    # Conv3d with stride == kernel is a matmul over the flattened (C, T, P, P) patch.
    self.patch_embed = linear(
      cfg.patch_dim, cfg.hidden_size, bias=False, dtype=dtype, param_dtype=param_dtype, rngs=rngs
    )
    # all blocks in one module with a leading block axis, run under lax.scan (see `block_schedule`)
    self.blocks = stacked(lambda r: VisionBlock(cfg, dtype=dtype, param_dtype=param_dtype, rngs=r), cfg.depth, rngs)
    self.merger = PatchMerger(cfg, dtype=dtype, param_dtype=param_dtype, rngs=rngs)

  def rotary(self, rotary_pos: jax.Array) -> tuple[jax.Array, jax.Array]:
    return axial_rotary(rotary_pos, self.cfg.head_dim, self.cfg.rope_theta)

  def features(self, pixel_values: jax.Array, layout: VisionLayout) -> tuple[jax.Array, None]:
    """(merged visual tokens [L / merge^2, out_hidden_size], None): the families' common tower output (Qwen3-VL's
    second item is its DeepStack features)."""
    return self(pixel_values, layout), None

  def __call__(self, pixel_values: jax.Array, layout: VisionLayout) -> jax.Array:
    unit = self.cfg.spatial_merge_size**2
    x = self.patch_embed(pixel_values.astype(self.patch_embed.kernel.dtype))
    seq, dim = x.shape
    x = x.reshape(seq // unit, unit, dim)[layout.window_index].reshape(seq, dim)
    cos, sin = self.rotary(layout.rotary_pos)

    def run(blocks):
      rotary = blocks.split(cos), blocks.split(sin)  # once per tower call, not per block
      return lambda block, x, _: block(x, *rotary, blocks)

    window, frames = run(layout.windows), run(layout.frames)
    period, runs = block_schedule(self.cfg.depth, self.cfg.fullatt_block_indexes)
    # unrolled, bf16 blocks converted to float32 one at a time (XLA:CPU), not the whole tower up front (a scan's
    # loop state copies its stacks whatever the tie: layers.scan_layers)
    kw = dict(policy=self.remat, unroll=self.unroll, per_layer_converts=self.unroll)
    if period and not self.unroll:
      # groups of (period - 1) window blocks + one full-attention block: two scan bodies whatever the depth
      graphdef, params = nnx.split(self.blocks)
      grouped = jax.tree.map(lambda a: a.reshape(-1, period, *a.shape[1:]), params)

      def group(x, group_params):
        g = nnx.merge(graphdef, group_params)
        x = scan_layers(g, window, x, stop=period - 1, **kw)
        return scan_layers(g, frames, x, start=period - 1, **kw), None

      x, _ = jax.lax.scan(group, x, grouped, unroll=self.unroll)
    else:  # unrolled: runs of the stack itself (a group's slice of it would be one more copy of its weights)
      for start, stop, full in runs or block_runs(self.cfg.depth, self.cfg.fullatt_block_indexes):
        x = scan_layers(self.blocks, frames if full else window, x, start=start, stop=stop, **kw)
    return self.merger(x)[layout.reverse_index]


def block_schedule(depth: int, fullatt_block_indexes) -> tuple[int, list[tuple[int, int, bool]]]:
  """How the ViT's blocks are scanned. Returns (period, runs): `period` k > 0 when every k-th block (k-1, 2k-1,
  ..., depth-1) and only those use full attention, as in every released Qwen2.5-VL (k = 8); else 0, and `runs`
  lists the maximal [start, stop) runs of blocks of one kind as (start, stop, full_attention)."""
  full = sorted({i for i in fullatt_block_indexes if 0 <= i < depth})
  if full and depth % (full[0] + 1) == 0:
    k = full[0] + 1
    if full == list(range(k - 1, depth, k)):
      return k, []
  return 0, block_runs(depth, full)


def block_runs(depth: int, fullatt_block_indexes) -> list[tuple[int, int, bool]]:
  """The maximal [start, stop) runs of blocks of one kind, as (start, stop, full_attention)."""
  full = {i for i in fullatt_block_indexes if 0 <= i < depth}
  runs, start = [], 0
  for i in range(1, depth + 1):
    if i == depth or (i in full) != ((i - 1) in full):
      runs.append((start, i, (i - 1) in full))
      start = i
  return runs
