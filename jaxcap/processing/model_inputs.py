"""The processor's output: a host-side (numpy) batch of prompts ready for the model, and the padding of token lists
into one."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from jaxcap.models.vision import VisionLayout


@dataclasses.dataclass
class ModelInputs:
  """A host-side (numpy) batch, ready for `Qwen25VL`.

  input_ids int32 [B, T]; attention_mask bool [B, T]; positions int32 [3, B, T]; rope_deltas int32 [B];
  pixel_values float32 [L, patch_dim] (all images then all videos) or None; grid_thw int [N, 3] in the same
  order; layout: `vision_layout(grid_thw)`; image_grid_thw / video_grid_thw / second_per_grid_ts as the HF
  processor returns them.
  """

  input_ids: np.ndarray
  attention_mask: np.ndarray
  positions: np.ndarray
  rope_deltas: np.ndarray
  pixel_values: np.ndarray | None = None
  grid_thw: np.ndarray | None = None
  layout: VisionLayout | None = None
  image_grid_thw: np.ndarray | None = None
  video_grid_thw: np.ndarray | None = None
  second_per_grid_ts: np.ndarray | None = None

  def vision(self):
    """The `VisionInput` for the model, or None for text-only batches."""
    from jaxcap.models.qwen25vl import VisionInput

    return None if self.pixel_values is None else VisionInput(self.pixel_values, self.layout)


def pad_batch(
  seqs: Sequence[Sequence[int]], pad_id: int, side: str = "left", multiple: int = 1
) -> tuple[np.ndarray, np.ndarray]:
  """Pads token lists to a common length (rounded up to `multiple`): ids int32 [B, T], mask bool [B, T]."""
  if side not in ("left", "right"):
    raise ValueError(f"padding_side={side!r}; use 'left' or 'right'")
  length = max(len(s) for s in seqs)
  length = -(-length // multiple) * multiple
  ids = np.full((len(seqs), length), pad_id, np.int32)
  mask = np.zeros((len(seqs), length), bool)
  for i, s in enumerate(seqs):
    sl = slice(length - len(s), length) if side == "left" else slice(0, len(s))
    ids[i, sl] = s
    mask[i, sl] = True
  return ids, mask
