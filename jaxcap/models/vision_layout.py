"""Host-side layouts of packed images / videos for the vision towers: attention segments, Qwen2.5-VL's window
permutation and rotary positions, and the static shapes (`LayoutShape`) they are padded to.

Variable image sizes are handled here, on the host: `vision_layout` turns `grid_thw` into index arrays, so the
device code is shape-static and jit-friendly. Padded to a bucketed `LayoutShape`, batches of images of any sizes
reuse one compilation per bucket.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import numpy as np

from jaxcap.buckets import DEFAULT_STEPS, batch_bucket, ladder
from jaxcap.models.config import VisionConfig


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AttentionBlocks:
  """A packed sequence cut into independent attention segments, padded to a common length.

  gather: int32 [S, Lmax]   position in the packed sequence of each slot (0 on padding).
  valid:  bool  [S, Lmax]   which slots hold a real token.
  scatter: int32 [L]        flat slot (s * Lmax + j) of each packed position, to undo the gather.
  tiled: static; True when the segments tile the sequence exactly (S x Lmax = L, every segment full and in
    order, as for same-size images whose sides are whole windows): the blocks are then a reshape, with no gather,
    scatter or mask (nor their scatter-add gradients).
  """

  gather: np.ndarray
  valid: np.ndarray
  scatter: np.ndarray
  tiled: bool = dataclasses.field(default=False, metadata=dict(static=True))

  def split(self, x: jax.Array) -> jax.Array:
    """x [L, ...] -> its segments [S, Lmax, ...] (padding slots hold position 0's values)."""
    return x.reshape(*self.gather.shape, *x.shape[1:]) if self.tiled else x[self.gather]

  def join(self, x: jax.Array) -> jax.Array:
    """Segments [S, Lmax, ...] -> the packed sequence [L, ...] (the inverse of `split` on real positions)."""
    flat = x.reshape(-1, *x.shape[2:])
    return flat if self.tiled else flat[self.scatter]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class VisionLayout:
  """Host-computed index arrays for one packed sequence of images/videos (see `vision_layout`). Every array's shape
  depends only on the `LayoutShape` it was padded to, not on the image sizes, so one program serves a bucket."""

  rotary_pos: np.ndarray  # int32 [L, 2]  (h, w) of each patch, window-permuted (0 on padding)
  window_index: np.ndarray  # int32 [L / merge^2]  merge-unit permutation into window order (identity on padding)
  reverse_index: np.ndarray  # int32 [L / merge^2]  back to pack order, every pack's real units first, padding last
  windows: AttentionBlocks  # window-attention segments (in permuted order)
  frames: AttentionBlocks  # full-attention segments: one per temporal patch of each image/video


@dataclasses.dataclass(frozen=True)
class LayoutShape:
  """The static shape of a `VisionLayout`: patches per pack (L), and each block set's (segments, segment length)."""

  patches: int
  windows: int
  window_len: int
  frames: int
  frame_len: int

  def union(self, other: "LayoutShape") -> "LayoutShape":
    """The elementwise maximum: a shape that holds both."""
    return LayoutShape(*(max(a, b) for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))

  def bucketed(self, cfg: VisionConfig, steps: int = DEFAULT_STEPS) -> "LayoutShape":
    """Rounded up: patches (what the ViT's MLPs cost) the `jaxcap.buckets.ladder` of `steps` sizes per octave, in
    whole merge units (64-patch multiples from 256 on, so a pack splits evenly over up to 64 devices); the attention
    segments' counts and lengths to powers of two (a window at most its full size), as attention over padded slots
    costs little next to the MLPs and fewer distinct shapes mean fewer programs."""
    unit = cfg.spatial_merge_size**2
    full_window = (cfg.window_size // cfg.patch_size) ** 2
    return LayoutShape(
      patches=ladder(self.patches, 64 if self.patches > 256 else unit, steps),
      windows=batch_bucket(self.windows),
      window_len=min(full_window, max(unit, batch_bucket(self.window_len))),
      frames=batch_bucket(self.frames),
      frame_len=max(unit, batch_bucket(self.frame_len)),
    )


def _item_geometry(t: int, h: int, w: int, cfg: VisionConfig):
  """One image / video's rotary positions [t*h*w, 2], window permutation of its merge units (local), window
  segment lengths and frame segment lengths (patches), as transformers' get_window_index / cu_seqlens."""
  m = cfg.spatial_merge_size
  unit = m * m
  win = cfg.window_size // m // cfg.patch_size  # window side in merge units
  if h % m or w % m:
    raise ValueError(
      f"grid {t}x{h}x{w} is not divisible by spatial_merge_size={m}; "
      "preprocess images with jaxcap.processing (smart_resize to a multiple of 28)."
    )
  hpos, wpos = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
  hpos = hpos.reshape(h // m, m, w // m, m).transpose(0, 2, 1, 3).reshape(-1)
  wpos = wpos.reshape(h // m, m, w // m, m).transpose(0, 2, 1, 3).reshape(-1)
  rot = np.tile(np.stack([hpos, wpos], -1), (t, 1))
  lh, lw = h // m, w // m
  index = np.arange(t * lh * lw).reshape(t, lh, lw)
  pad_h, pad_w = win - lh % win, win - lw % win
  nh, nw = (lh + pad_h) // win, (lw + pad_w) // win
  padded = np.pad(index, ((0, 0), (0, pad_h), (0, pad_w)), constant_values=-100)
  padded = padded.reshape(t, nh, win, nw, win).transpose(0, 1, 3, 2, 4).reshape(t, nh * nw, win, win)
  lens = (padded != -100).sum((2, 3)).reshape(-1)
  flat = padded.reshape(-1)
  return rot, flat[flat != -100], [int(n) * unit for n in lens if n > 0], [h * w] * t


def as_packs(grid_thw) -> list[np.ndarray]:
  if isinstance(grid_thw, (list, tuple)) and (not grid_thw or np.ndim(grid_thw[0]) == 2):
    return [np.asarray(g, np.int64).reshape(-1, 3) for g in grid_thw]
  return [np.asarray(grid_thw, np.int64).reshape(-1, 3)]


def layout_shape(grid_thw, cfg: VisionConfig) -> LayoutShape:
  """The exact (unpadded) shape `vision_layout` needs for `grid_thw` (int [N, 3], or a list of packs: then
  patches is the largest pack's and the segment counts are totals)."""
  patches = windows = window_len = frames = frame_len = 0
  for pack in as_packs(grid_thw):
    patches = max(patches, int(np.prod(pack, -1).sum()) if len(pack) else 0)
    for t, h, w in pack.tolist():
      _, _, wl, fl = _item_geometry(t, h, w, cfg)
      windows, frames = windows + len(wl), frames + len(fl)
      window_len, frame_len = max([window_len, *wl]), max([frame_len, *fl])
  return LayoutShape(patches, max(windows, 1), max(window_len, 1), max(frames, 1), max(frame_len, 1))


def attention_blocks(segments: Sequence[tuple[int, int]], total: int, count: int, length: int) -> AttentionBlocks:
  """`segments` (start, length) of a packed sequence of `total` positions, in `count` rows of `length` slots.

  Rows past the real segments attend one key (a finite softmax; their output is never read); positions in no
  segment (padding) read back the last slot, so they never feed a real position."""
  if len(segments) > count or any(n > length for _, n in segments):
    raise ValueError(f"{len(segments)} segments up to {max(n for _, n in segments)} long do not fit {count}x{length}")
  gather = np.zeros((count, length), np.int32)
  valid = np.zeros((count, length), bool)
  valid[len(segments) :, 0] = True
  scatter = np.full((total,), count * length - 1, np.int32)
  for s, (start, n) in enumerate(segments):
    gather[s, :n] = np.arange(start, start + n)
    valid[s, :n] = True
    scatter[start : start + n] = s * length + np.arange(n)
  tiled = count * length == total and segments == [(s * length, length) for s in range(count)]
  return AttentionBlocks(gather, valid, scatter, tiled=tiled)


def vision_layout(grid_thw, cfg: VisionConfig, shape: LayoutShape | None = None) -> VisionLayout:
  """Index arrays for `grid_thw` (int [N, 3]: temporal, height, width patches per image/video, in pack order).

  Mirrors `transformers`' get_vision_position_ids / get_vision_window_index / cu_seqlens, as static arrays.
  With `shape`, each pack is padded to `shape.patches` patches and the segments to the shape's counts and
  lengths: padding patches attend only among themselves (never a real image's) and the arrays' shapes depend on
  `shape` alone. `grid_thw` may be a list of packs (e.g. one per process of a global batch), laid end to end.
  """
  packs = as_packs(grid_thw)
  unit = cfg.spatial_merge_size**2
  exact = layout_shape(packs, cfg)
  pad_packs = shape is not None
  if shape is None:
    shape = exact
  else:
    if shape.union(exact) != shape:
      raise ValueError(f"vision items needing {exact} do not fit the layout shape {shape}")
    if shape.patches % unit:
      raise ValueError(f"layout shape of {shape.patches} patches is not whole merge units of {unit}")
  rot, window_index, window_segs, frame_segs, is_real = [], [], [], [], []
  pos = 0  # patches laid out so far
  for pack in packs:
    start = pos
    for t, h, w in pack.tolist():
      r, index, wl, fl = _item_geometry(t, h, w, cfg)
      rot.append(r.reshape(-1, unit, 2)[index].reshape(-1, 2))
      window_index.append(index + pos // unit)
      is_real.append(np.ones(len(index), bool))
      for n in wl:
        window_segs.append((pos, n))
        pos += n
      pos -= sum(wl)
      for n in fl:
        frame_segs.append((pos, n))
        pos += n
    if pad_packs and (pad := start + shape.patches - pos):
      rot.append(np.zeros((pad, 2), np.int64))
      window_index.append(np.arange(pos // unit, pos // unit + pad // unit))
      is_real.append(np.zeros(pad // unit, bool))
      pos += pad
  window_index = np.concatenate(window_index).astype(np.int32)
  is_real = np.concatenate(is_real)
  # merged features come out with every real unit first, in pack order (the order the model places them at the
  # prompts' vision tokens), then the padding of all packs
  reverse = np.argsort(window_index)
  reverse = np.concatenate([reverse[is_real], reverse[~is_real]])
  return VisionLayout(
    rotary_pos=np.concatenate(rot).astype(np.int32),
    window_index=window_index,
    reverse_index=reverse.astype(np.int32),
    windows=attention_blocks(window_segs, pos, shape.windows, shape.window_len),
    frames=attention_blocks(frame_segs, pos, shape.frames, shape.frame_len),
  )


def stack_layouts(layouts: Sequence[VisionLayout]) -> VisionLayout:
  """Layouts of one shape -> one layout whose arrays carry a leading axis (e.g. one per micro-batch); its block
  sets are `tiled` only where every layout's are (one program serves all the micro-batches)."""
  untile = lambda b, tiled: dataclasses.replace(b, tiled=tiled)
  windows = all(lay.windows.tiled for lay in layouts)
  frames = all(lay.frames.tiled for lay in layouts)
  layouts = [
    dataclasses.replace(lay, windows=untile(lay.windows, windows), frames=untile(lay.frames, frames)) for lay in layouts
  ]
  return jax.tree.map(lambda *xs: np.stack(xs), *layouts)
