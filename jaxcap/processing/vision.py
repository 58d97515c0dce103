"""Image and video preprocessing equal to `Qwen2VLImageProcessor` / `Qwen2VLVideoProcessor` (numpy + Pillow).

Output layout: patches float32 [grid_t * grid_h * grid_w, C * temporal_patch * patch^2] ordered by
(t, h-block, w-block, merge-row, merge-col), and grid_thw int [3] counted in patches.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Sequence

import numpy as np
from PIL import Image

# OpenAI CLIP statistics, as in the Qwen2-VL processors.
IMAGE_MEAN = np.array([0.48145466, 0.4578275, 0.40821073], np.float32)
IMAGE_STD = np.array([0.26862954, 0.26130258, 0.27577711], np.float32)


@dataclasses.dataclass(frozen=True)
class VisionPreprocessConfig:
  """Pixel budget and geometry; defaults are Qwen2.5-VL's `preprocessor_config.json`."""

  min_pixels: int = 56 * 56
  max_pixels: int = 28 * 28 * 1280
  patch_size: int = 14
  temporal_patch_size: int = 2
  merge_size: int = 2
  resample: int = Image.Resampling.BICUBIC

  @property
  def factor(self) -> int:
    return self.patch_size * self.merge_size


def smart_resize(
  height: int, width: int, factor: int = 28, min_pixels: int = 56 * 56, max_pixels: int = 28 * 28 * 1280
) -> tuple[int, int]:
  """Target (height, width): multiples of `factor`, area within [min_pixels, max_pixels], aspect kept."""
  if max(height, width) / min(height, width) > 200:
    raise ValueError(f"image of {height}x{width} has aspect ratio above 200; crop or pad it first.")
  h_bar = round(height / factor) * factor
  w_bar = round(width / factor) * factor
  if h_bar * w_bar > max_pixels:
    beta = math.sqrt((height * width) / max_pixels)
    h_bar = max(factor, math.floor(height / beta / factor) * factor)
    w_bar = max(factor, math.floor(width / beta / factor) * factor)
  elif h_bar * w_bar < min_pixels:
    beta = math.sqrt(min_pixels / (height * width))
    h_bar = math.ceil(height * beta / factor) * factor
    w_bar = math.ceil(width * beta / factor) * factor
  return h_bar, w_bar


def load_image(source: str | os.PathLike | Image.Image | np.ndarray) -> Image.Image:
  """An RGB PIL image from a path, PIL image or uint8 HWC array; a clear error names an unreadable file."""
  if isinstance(source, Image.Image):
    image = source
  elif isinstance(source, np.ndarray):
    image = Image.fromarray(source)
  else:
    try:
      with Image.open(source) as f:
        image = f.copy()
    except (OSError, ValueError) as e:
      raise ValueError(f"cannot read image {os.fspath(source)!r}: {e}") from e
  return image.convert("RGB") if image.mode != "RGB" else image


def _resize_normalize(image: Image.Image, size: tuple[int, int], cfg: VisionPreprocessConfig) -> np.ndarray:
  """RGB image -> float32 [C, H, W] at `size` (h, w), rescaled to [0, 1] and CLIP-normalised."""
  h, w = size
  if image.size != (w, h):
    image = image.resize((w, h), resample=cfg.resample)
  x = np.asarray(image, np.float32) * np.float32(1 / 255)
  x = (x - IMAGE_MEAN) / IMAGE_STD
  return x.transpose(2, 0, 1)


def _patchify(frames: np.ndarray, cfg: VisionPreprocessConfig) -> tuple[np.ndarray, np.ndarray]:
  """frames float32 [F, C, H, W] (F a multiple of temporal_patch_size) -> (patches, grid_thw)."""
  f, c, h, w = frames.shape
  p, m, tp = cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size
  gt, gh, gw = f // tp, h // p, w // p
  x = frames.reshape(gt, tp, c, gh // m, m, p, gw // m, m, p)
  x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
  return x.reshape(gt * gh * gw, c * tp * p * p), np.array([gt, gh, gw], np.int64)


def preprocess_image(image, cfg: VisionPreprocessConfig = VisionPreprocessConfig()) -> tuple[np.ndarray, np.ndarray]:
  """One image (path, PIL or uint8 array) -> (patches float32 [gh * gw, patch_dim], grid_thw [1, gh, gw])."""
  image = load_image(image)
  size = smart_resize(image.height, image.width, cfg.factor, cfg.min_pixels, cfg.max_pixels)
  x = _resize_normalize(image, size, cfg)
  frames = np.broadcast_to(x[None], (cfg.temporal_patch_size, *x.shape))  # a still image is duplicated in time
  return _patchify(frames, cfg)


def preprocess_video(
  frames: Sequence, cfg: VisionPreprocessConfig = VisionPreprocessConfig()
) -> tuple[np.ndarray, np.ndarray]:
  """Already-sampled frames (paths, PIL images or uint8 arrays) -> (patches, grid_thw [gt, gh, gw]).

  Every frame is resized to the first frame's smart_resize target; the last frame is repeated to fill the
  final temporal patch.
  """
  images = [load_image(f) for f in frames]
  if not images:
    raise ValueError("a video needs at least one frame")
  size = smart_resize(images[0].height, images[0].width, cfg.factor, cfg.min_pixels, cfg.max_pixels)
  x = np.stack([_resize_normalize(im, size, cfg) for im in images])
  if pad := -len(x) % cfg.temporal_patch_size:
    x = np.concatenate([x, np.repeat(x[-1:], pad, axis=0)])
  return _patchify(x, cfg)
