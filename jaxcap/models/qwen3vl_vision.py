"""The Qwen3-VL vision tower: patch 16 embedding plus bilinearly resampled learned position embeddings, 2D RoPE,
full attention per frame (no windows), a 2x2 merger, and DeepStack mergers of intermediate blocks' outputs.

As for Qwen2.5-VL (`jaxcap.models.vision`), everything that depends on the image sizes is computed on the host
(`qwen3_vision_layout`): the device code sees static shapes, one program per `LayoutShape`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxcap.models.layers import LayerNorm, linear, scan_layers, stacked
from jaxcap.models.qwen3vl_config import Qwen3VisionConfig
from jaxcap.models.vision import VisionAttention, axial_rotary
from jaxcap.models.vision_layout import AttentionBlocks, LayoutShape, as_packs, attention_blocks


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Qwen3VisionLayout:
  """Host-computed arrays for one packed sequence of images / videos (see `qwen3_vision_layout`)."""

  rotary_pos: np.ndarray  # int32 [L, 2]  (row, column) of each patch, merge-block order (0 on padding)
  interp_index: np.ndarray  # int32 [L, 4]  the learned grid's entries each patch interpolates (bilinear taps)
  interp_weight: np.ndarray  # float32 [L, 4]  their weights (0 on padding)
  reverse_index: np.ndarray  # int32 [L / merge^2]  merged units: every pack's real ones in order, then padding
  frames: AttentionBlocks  # attention segments: one per temporal patch of each image / video


def _taps(index: np.ndarray, size: int, side: int) -> tuple[np.ndarray, np.ndarray]:
  """Bilinear taps (align_corners=True) into a `side`-long axis for positions `index` on an axis of `size`: int
  [n, 2] and float32 weights [n, 2], in float32 as transformers' get_vision_interpolation_indices_and_weights."""
  src = index.astype(np.float32) * np.float32(side - 1) / np.float32(max(size - 1, 1))
  floor = np.floor(src)
  offsets = np.arange(2)
  taps = np.clip(floor.astype(np.int64)[:, None] + offsets, 0, side - 1)
  weights = np.maximum(np.float32(1) - np.abs(src[:, None] - floor[:, None] - offsets.astype(np.float32)), 0)
  return taps, weights.astype(np.float32)


def _item(t: int, h: int, w: int, cfg: Qwen3VisionConfig):
  """One image / video's rotary positions [t*h*w, 2], interpolation taps and weights [t*h*w, 4], merge-block order
  (each 2x2 block of patches consecutive, as the processor lays patches out)."""
  m = cfg.spatial_merge_size
  if h % m or w % m:
    raise ValueError(f"grid {t}x{h}x{w} is not divisible by spatial_merge_size={m}; preprocess with the processor")
  rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
  rows = rows.reshape(h // m, m, w // m, m).transpose(0, 2, 1, 3).reshape(-1)
  cols = cols.reshape(h // m, m, w // m, m).transpose(0, 2, 1, 3).reshape(-1)
  side = cfg.grid_side
  (rt, rw), (ct, cw) = _taps(rows, h, side), _taps(cols, w, side)
  index = (rt[:, :, None] * side + ct[:, None, :]).reshape(-1, 4)
  weight = (rw[:, :, None] * cw[:, None, :]).reshape(-1, 4)
  tile = lambda a: np.tile(a, (t, 1))
  return tile(np.stack([rows, cols], -1)), tile(index), tile(weight)


def qwen3_layout_shape(grid_thw) -> LayoutShape:
  """The exact shape `qwen3_vision_layout` needs (its window fields are unused, 1)."""
  packs = as_packs(grid_thw)
  patches = max([int(np.prod(p, -1).sum()) if len(p) else 0 for p in packs] or [0])
  frames = sum(int(t) for p in packs for t, _, _ in p.tolist())
  frame_len = max([h * w for p in packs for _, h, w in p.tolist()] or [1])
  return LayoutShape(patches, 1, 1, max(frames, 1), frame_len)


def qwen3_vision_layout(grid_thw, cfg: Qwen3VisionConfig, shape: LayoutShape | None = None) -> Qwen3VisionLayout:
  """Arrays for `grid_thw` (int [N, 3] temporal, height, width patches per item in pack order, or a list of
  packs), mirroring transformers' Qwen3VLVisionModel inputs. With `shape`, each pack is padded to `shape.patches`
  patches (padding attends only among itself) and the frame segments to the shape's count and length."""
  packs = as_packs(grid_thw)
  unit = cfg.spatial_merge_size**2
  exact = qwen3_layout_shape(packs)
  if shape is None:
    shape, pad_packs = exact, False
  else:
    pad_packs = True
    if shape.union(exact) != shape or shape.patches % unit:
      raise ValueError(f"vision items needing {exact} do not fit the layout shape {shape} (whole merge units)")
  rot, index, weight, segments, is_real = [], [], [], [], []
  pos = 0
  for pack in packs:
    start = pos
    for t, h, w in pack.tolist():
      r, i, wt = _item(t, h, w, cfg)
      rot.append(r)
      index.append(i)
      weight.append(wt)
      is_real.append(np.ones(t * h * w // unit, bool))
      segments += [(pos + k * h * w, h * w) for k in range(t)]
      pos += t * h * w
    if pad_packs and (pad := start + shape.patches - pos):
      rot.append(np.zeros((pad, 2), np.int64))
      index.append(np.zeros((pad, 4), np.int64))
      weight.append(np.zeros((pad, 4), np.float32))
      is_real.append(np.zeros(pad // unit, bool))
      pos += pad
  is_real = np.concatenate(is_real)
  units = np.arange(len(is_real))
  return Qwen3VisionLayout(
    rotary_pos=np.concatenate(rot).astype(np.int32),
    interp_index=np.concatenate(index).astype(np.int32),
    interp_weight=np.concatenate(weight).astype(np.float32),
    reverse_index=np.concatenate([units[is_real], units[~is_real]]).astype(np.int32),
    frames=attention_blocks(segments, pos, shape.frames, shape.frame_len),
  )


class VisionMLP(nnx.Module):
  """fc2(gelu_tanh(fc1(x))), with biases."""

  def __init__(self, cfg: Qwen3VisionConfig, *, dtype, param_dtype, rngs):
    kw = dict(bias=True, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.linear_fc1 = linear(cfg.hidden_size, cfg.intermediate_size, **kw)
    self.linear_fc2 = linear(cfg.intermediate_size, cfg.hidden_size, **kw)

  def __call__(self, x):
    return self.linear_fc2(jax.nn.gelu(self.linear_fc1(x), approximate=True))


class VisionBlock(nnx.Module):
  def __init__(self, cfg: Qwen3VisionConfig, *, dtype, param_dtype, rngs):
    self.norm1 = LayerNorm(cfg.hidden_size, 1e-6, param_dtype=param_dtype)
    self.norm2 = LayerNorm(cfg.hidden_size, 1e-6, param_dtype=param_dtype)
    self.attn = VisionAttention(cfg, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.mlp = VisionMLP(cfg, dtype=dtype, param_dtype=param_dtype, rngs=rngs)

  def __call__(self, x, cos, sin, blocks: AttentionBlocks):
    x = x + self.attn(self.norm1(x), cos, sin, blocks)
    return x + self.mlp(self.norm2(x))


class PatchMerger(nnx.Module):
  """LayerNorm (of each patch, or of each concatenated 2x2 group: `postshuffle`, the DeepStack mergers'), then
  each group projected to the LM width by a GELU MLP."""

  def __init__(self, cfg: Qwen3VisionConfig, *, postshuffle: bool, dtype, param_dtype, rngs):
    self.unit_dim = cfg.hidden_size * cfg.spatial_merge_size**2
    self.postshuffle = postshuffle
    self.norm = LayerNorm(self.unit_dim if postshuffle else cfg.hidden_size, 1e-6, param_dtype=param_dtype)
    kw = dict(bias=True, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.linear_fc1 = linear(self.unit_dim, self.unit_dim, **kw)
    self.linear_fc2 = linear(self.unit_dim, cfg.out_hidden_size, **kw)

  def __call__(self, x):
    x = self.norm(x.reshape(-1, self.unit_dim)) if self.postshuffle else self.norm(x).reshape(-1, self.unit_dim)
    return self.linear_fc2(jax.nn.gelu(self.linear_fc1(x), approximate=False))


class Qwen3VisionTower(nnx.Module):
  """pixel patches [L, patch_dim] + layout -> (merged visual tokens [L / merge^2, out_hidden_size], DeepStack
  features [n, L / merge^2, out_hidden_size] of the n `deepstack_visual_indexes` blocks in block order, or None)."""

  def __init__(
    self,
    cfg: Qwen3VisionConfig,
    *,
    dtype=jnp.float32,
    param_dtype=jnp.float32,
    remat: str = "none",
    unroll: bool = False,
    rngs: nnx.Rngs,
  ):
    self.cfg, self.remat, self.unroll = cfg, remat, unroll
    kw = dict(dtype=dtype, param_dtype=param_dtype)
    # Conv3d with stride == kernel is a matmul over the flattened (C, T, P, P) patch.
    self.patch_embed = linear(cfg.patch_dim, cfg.hidden_size, bias=True, rngs=rngs, **kw)
    self.pos_embed = nnx.Embed(
      cfg.num_position_embeddings, cfg.hidden_size, embedding_init=nnx.initializers.normal(0.02), rngs=rngs, **kw
    )
    self.blocks = stacked(lambda r: VisionBlock(cfg, rngs=r, **kw), cfg.depth, rngs)
    self.merger = PatchMerger(cfg, postshuffle=False, rngs=rngs, **kw)
    if cfg.deepstack_visual_indexes:
      n = len(cfg.deepstack_visual_indexes)
      self.deepstack_merger_list = stacked(lambda r: PatchMerger(cfg, postshuffle=True, rngs=r, **kw), n, rngs)

  def __call__(self, pixel_values: jax.Array, layout: Qwen3VisionLayout) -> tuple[jax.Array, jax.Array | None]:
    x = self.patch_embed(pixel_values.astype(self.patch_embed.kernel.dtype))
    table = self.pos_embed.embedding[...].astype(jnp.float32)
    pos = jnp.sum(table[layout.interp_index] * layout.interp_weight[..., None], axis=1)
    x = x + pos.astype(x.dtype)
    cos, sin = axial_rotary(layout.rotary_pos, self.cfg.head_dim, self.cfg.rope_theta)
    frames = layout.frames
    rotary = frames.split(cos), frames.split(sin)  # once per tower call, not per block
    body = lambda block, x, _: block(x, *rotary, frames)
    # unrolled, bf16 blocks converted to float32 one at a time on XLA:CPU, not the whole tower up front
    kw = dict(policy=self.remat, unroll=self.unroll, per_layer_converts=self.unroll)
    order = list(self.cfg.deepstack_visual_indexes)
    feats, start = [], 0
    for layer in sorted(order):  # the blocks in runs, each ending at a DeepStack block
      x = scan_layers(self.blocks, body, x, start=start, stop=layer + 1, **kw)
      feats.append(self._deepstack_merger(order.index(layer))(x))
      start = layer + 1
    x = scan_layers(self.blocks, body, x, start=start, **kw)
    merged = self.merger(x)[layout.reverse_index]
    return merged, (jnp.stack(feats)[:, layout.reverse_index] if feats else None)

  def features(self, pixel_values: jax.Array, layout: Qwen3VisionLayout) -> tuple[jax.Array, jax.Array | None]:
    """The families' common tower output: this tower's own (merged tokens, DeepStack features or None)."""
    return self(pixel_values, layout)

  def _deepstack_merger(self, i: int) -> PatchMerger:
    graphdef, params = nnx.split(self.deepstack_merger_list)
    return nnx.merge(graphdef, jax.tree.map(lambda a: a[i], params))
