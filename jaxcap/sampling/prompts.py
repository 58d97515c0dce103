"""Prompt batches for the compiled sampler, padded on the host to fixed shape buckets.

The sampler compiles once per bucket: (batch rows, prompt length, vision patch shapes). Batch rows are rounded up
to a power of two and prompt length up to a multiple, so calls with slightly different batches reuse one program.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from jaxcap.models.config import Qwen25VLConfig
from jaxcap.models.qwen25vl import VisionInput
from jaxcap.models.vision import vision_layout
from jaxcap.processing.prompt import ModelInputs


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


def batch_bucket(rows: int) -> int:
  """The compiled batch size for `rows` prompts: the next power of two."""
  return 1 << max(0, int(rows) - 1).bit_length()


def bucket_prompts(
  inputs: ModelInputs, cfg: Qwen25VLConfig, *, length_multiple: int = 16, pad_id: int = 0
) -> tuple[Prompts, int]:
  """Pads a processor batch to its bucket. Returns (numpy `Prompts`, number of real rows, which come first).

  Extra rows repeat the last real row, images included when the batch has no videos, so a short final batch of
  same-size images has the same vision shapes as a full one; extra prompt columns are left padding.
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

  extra = batch_bucket(rows) - rows
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

  pad = -length % length_multiple
  if pad:
    ids = np.pad(ids, ((0, 0), (pad, 0)), constant_values=pad_id)
    mask = np.pad(mask, ((0, 0), (pad, 0)))
    positions = np.pad(positions, ((0, 0), (0, 0), (pad, 0)))
  vision = None
  if pixels is not None:
    layout = inputs.layout if grids is inputs.grid_thw else vision_layout(grids, cfg.vision)
    vision = VisionInput(np.asarray(pixels, np.float32), layout)
  return Prompts(ids, mask, positions, deltas, vision), rows


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
