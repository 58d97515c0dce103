"""Prompt batches for the compiled sampler, padded on the host to fixed shape buckets.

The sampler compiles once per bucket: (batch rows, prompt length, vision layout shape). Batch rows are rounded up
to a power of two, prompt length and the vision pack (images of any sizes) up the `jaxcap.buckets.ladder`, so a
stream of batches of many image sizes reuses a handful of programs.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from jaxcap.buckets import DEFAULT_STEPS, batch_bucket, ladder
from jaxcap.models.config import Qwen25VLConfig
from jaxcap.models.qwen25vl import VisionInput
from jaxcap.models.families import layout_for, layout_shape_for
from jaxcap.processing.model_inputs import ModelInputs


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Prompts:
  """Left-padded prompts: input_ids int32 [B, T]; attention_mask bool [B, T]; positions int32 [3, B, T] (mRoPE);
  rope_deltas int32 [B] (max position + 1 - real tokens); vision: the batch's images/videos or None."""

  input_ids: jax.Array
  attention_mask: jax.Array
  positions: jax.Array
  rope_deltas: jax.Array
  vision: VisionInput | None = None

  @property
  def batch(self) -> int:
    return self.input_ids.shape[0]

  @property
  def length(self) -> int:
    return self.input_ids.shape[1]


@dataclasses.dataclass(frozen=True)
class VisionItems:
  """Host-side description of a batch's vision pack: grid_thw int [N, 3] of its images then videos (pack order),
  rows int [N] the prompt row of each, and `patches` the pack's padded length (its bucket)."""

  grid_thw: np.ndarray
  rows: np.ndarray
  patches: int


def item_rows(input_ids: np.ndarray, image_grid, video_grid, cfg: Qwen25VLConfig) -> np.ndarray:
  """The prompt row of each image then video (pack order), from where their placeholder tokens sit."""
  merge = cfg.vision.spatial_merge_size**2
  out = []
  for grids, token in ((image_grid, cfg.image_token_id), (video_grid, cfg.video_token_id)):
    if grids is None or not len(grids):
      continue
    row_of_token = np.nonzero(np.asarray(input_ids) == token)[0]  # row-major, as the model places features
    starts = np.concatenate([[0], np.cumsum(np.prod(grids, -1) // merge)[:-1]])
    if len(row_of_token) != int(np.prod(grids, -1).sum()) // merge:
      raise ValueError(f"{len(row_of_token)} vision tokens for {len(grids)} items of {np.asarray(grids).tolist()}")
    out.append(row_of_token[starts])
  return np.concatenate(out).astype(np.int32) if out else np.zeros((0,), np.int32)


def bucket_prompts(
  inputs: ModelInputs,
  cfg: Qwen25VLConfig,
  *,
  length_multiple: int = 16,
  pad_id: int = 0,
  steps: int = DEFAULT_STEPS,
  rows_multiple: int = 1,
) -> tuple[Prompts, int, VisionItems | None]:
  """Pads a processor batch to its bucket. Returns (numpy `Prompts`, number of real rows, which come first, and
  the vision pack's items or None).

  Rows are padded to a power of two, then up to a multiple of `rows_multiple` (a mesh's device count: the batch
  then splits over it); extra rows repeat the last real row, its images included when the batch has no videos, so
  a short final batch has the vision shapes of a full one. The prompt length is padded to the
  `jaxcap.buckets.ladder` (in `length_multiple` steps) with left padding, and the vision pack, images of any sizes,
  to a bucketed `LayoutShape` (`steps` sizes per octave).
  """
  ids = np.asarray(inputs.input_ids, np.int32)
  mask = np.asarray(inputs.attention_mask, bool)
  if ids.ndim != 2 or ids.shape[0] == 0:
    raise ValueError(f"input_ids has shape {ids.shape}; expected [batch >= 1, length]")
  if not mask[:, -1].all():
    raise ValueError(
      "prompts must be left-padded (every row's last token real) so that generation continues "
      "from the same column; build them with Processor(..., padding_side='left')."
    )
  rows, length = ids.shape
  positions = np.asarray(inputs.positions, np.int32)
  deltas = np.asarray(inputs.rope_deltas, np.int32)
  pixels, grids = inputs.pixel_values, inputs.grid_thw
  extra = -(-batch_bucket(rows) // rows_multiple) * rows_multiple - rows
  if extra:
    ids = np.concatenate([ids, np.repeat(ids[-1:], extra, 0)])
    mask = np.concatenate([mask, np.repeat(mask[-1:], extra, 0)])
    positions = np.concatenate([positions, np.repeat(positions[:, -1:], extra, 1)], 1)
    deltas = np.concatenate([deltas, np.repeat(deltas[-1:], extra, 0)])
    if pixels is not None and inputs.video_grid_thw is None:
      pixels, grids = _repeat_last_row_images(ids[rows - 1], pixels, grids, cfg, extra)
    elif pixels is not None:  # videos are packed after all images: extra rows must hold no vision tokens
      vision_token = (ids[rows:] == cfg.image_token_id) | (ids[rows:] == cfg.video_token_id)
      ids[rows:][vision_token] = pad_id
  prompts = pad_length(Prompts(ids, mask, positions, deltas), ladder(length, length_multiple, steps), pad_id)
  items = None
  if pixels is not None:
    grids = np.asarray(grids)
    image_grid = grids if inputs.video_grid_thw is None else inputs.image_grid_thw
    shape = layout_shape_for(grids, cfg.vision).bucketed(cfg.vision, steps)
    items = VisionItems(grids, item_rows(ids, image_grid, inputs.video_grid_thw, cfg), shape.patches)
    pixels = pad_patches(pixels, shape.patches)
    prompts = dataclasses.replace(prompts, vision=VisionInput(pixels, layout_for(grids, cfg.vision, shape)))
  return prompts, rows, items


def pad_length(prompts: Prompts, length: int, pad_id: int = 0) -> Prompts:
  """Left-pads host prompts to `length` columns."""
  pad = length - prompts.length
  if pad < 0:
    raise ValueError(f"prompts of {prompts.length} tokens do not fit a length of {length}")
  if pad == 0:
    return prompts
  return dataclasses.replace(
    prompts,
    input_ids=np.pad(prompts.input_ids, ((0, 0), (pad, 0)), constant_values=pad_id),
    attention_mask=np.pad(prompts.attention_mask, ((0, 0), (pad, 0))),
    positions=np.pad(prompts.positions, ((0, 0), (0, 0), (pad, 0))),
  )


def pad_patches(pixels: np.ndarray, patches: int) -> np.ndarray:
  """float32 [L, patch_dim] -> [patches, patch_dim], zero patches appended."""
  pixels = np.asarray(pixels, np.float32)
  return np.pad(pixels, ((0, patches - pixels.shape[0]), (0, 0)))


def _repeat_last_row_images(last_ids, pixels, grids, cfg: Qwen25VLConfig, copies: int):
  """Appends `copies` more copies of the last row's images (the last ones packed when there are no videos)."""
  merge = cfg.vision.spatial_merge_size**2
  want = int((last_ids == cfg.image_token_id).sum())
  sizes = np.prod(grids, -1)
  n, got = 0, 0
  while got < want:
    n += 1
    got += int(sizes[-n]) // merge
  if n == 0:
    return pixels, grids
  patches = int(sizes[-n:].sum())
  tail = pixels[-patches:]
  return (np.concatenate([pixels] + [tail] * copies), np.concatenate([grids] + [grids[-n:]] * copies))
