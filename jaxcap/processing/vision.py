"""Image preprocessing equal to transformers' `Qwen2VLImageProcessorPil` (numpy + Pillow), configured from a
checkpoint's `preprocessor_config.json`; images are loaded as transformers loads them
(`jaxcap.processing.image_decoding`).

Output layout: patches float32 [grid_t * grid_h * grid_w, C * temporal_patch * patch^2] ordered by
(t, h-block, w-block, merge-row, merge-col), and grid_thw int [3] counted in patches.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from PIL import Image

from jaxcap.processing.image_decoding import DEFAULT_MAX_IMAGE_PIXELS, load_image

# OpenAI CLIP statistics, the Qwen2-VL processors' defaults.
OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

IMAGE_CONFIG = "preprocessor_config.json"
PROCESSOR_CONFIG = "processor_config.json"  # transformers v5 nests {"image_processor": ..., "video_processor": ...}


def read_processor_dict(directory: str | os.PathLike, kind: str) -> tuple[dict, str | None]:
  """The `kind` ("image_processor" / "video_processor") settings of a checkpoint and the file they came from,
  with transformers' priority: `processor_config.json`'s nested entry, then `video_preprocessor_config.json`
  (videos only), then `preprocessor_config.json`. ({}, None) when the directory has none of them."""
  directory = Path(directory)
  nested = directory / PROCESSOR_CONFIG
  if nested.is_file():
    row = _read_json(nested)
    if isinstance(row.get(kind), dict):
      return row[kind], f"{nested} [{kind}]"
  names = ("video_preprocessor_config.json", IMAGE_CONFIG) if kind == "video_processor" else (IMAGE_CONFIG,)
  for name in names:
    if (directory / name).is_file():
      return _read_json(directory / name), str(directory / name)
  return {}, None


def _read_json(path: Path) -> dict:
  try:
    row = json.loads(path.read_text())
  except (OSError, ValueError) as e:
    raise ValueError(f"cannot read {path}: {e}; fix or delete the file") from e
  if not isinstance(row, dict):
    raise ValueError(f"{path} holds a {type(row).__name__}, not a JSON object; fix or delete the file")
  return row


def pixel_budget(row: Mapping[str, Any], default_min: int, default_max: int, source: str) -> tuple[int, int]:
  """(min_pixels, max_pixels) as the Qwen2-VL processors' `__init__` reads them: `size` {shortest_edge,
  longest_edge} (or the class default when absent), overridden by top-level `min_pixels` / `max_pixels`."""
  size = row.get("size")
  size = {"shortest_edge": default_min, "longest_edge": default_max} if size is None else dict(size)
  for key, alias in (("shortest_edge", "min_pixels"), ("longest_edge", "max_pixels")):
    if row.get(alias) is not None:
      size[key] = row[alias]
    elif key not in size and alias in size:  # old configs spelled the size keys min_pixels / max_pixels
      size[key] = size[alias]
  if not size.get("shortest_edge") or not size.get("longest_edge"):
    raise ValueError(
      f"{source}: size {row.get('size')} has no shortest_edge / longest_edge pixel budget; set 'min_pixels' and "
      "'max_pixels' (pixels per image) in that file."
    )
  return int(size["shortest_edge"]), int(size["longest_edge"])


def normalisation(row: Mapping[str, Any], source: str) -> dict[str, Any]:
  """The rescale / normalise / geometry fields shared by the image and video processor configs."""
  out = {}
  for key, cast in (("patch_size", int), ("temporal_patch_size", int), ("merge_size", int)):
    if row.get(key) is not None:
      out[key] = cast(row[key])
  for key in ("image_mean", "image_std"):
    if row.get(key) is not None:
      value = row[key]
      value = (value,) * 3 if isinstance(value, (int, float)) else tuple(float(v) for v in value)
      if len(value) != 3:
        raise ValueError(f"{source}: {key} has {len(value)} entries; give one per RGB channel (3).")
      out[key] = value
  for key in ("do_rescale", "do_normalize"):
    if row.get(key) is not None:
      out[key] = bool(row[key])
  if row.get("rescale_factor") is not None:
    out["rescale_factor"] = float(row["rescale_factor"])
  if row.get("resample") is not None:
    out["resample"] = int(row["resample"])
  for key in ("do_resize", "do_convert_rgb"):
    if row.get(key) is False:
      raise ValueError(f"{source} sets {key}=false; jaxcap always resizes and converts to RGB, remove the entry.")
  return out


@dataclasses.dataclass(frozen=True)
class VisionPreprocessConfig:
  """Image pixel budget, geometry and normalisation; defaults are transformers' `Qwen2VLImageProcessor`'s.

  min_pixels / max_pixels bound the resized area (pixels); `max_image_pixels` rejects larger files before
  decoding (None: no limit)."""

  min_pixels: int = 56 * 56
  max_pixels: int = 28 * 28 * 1280
  patch_size: int = 14
  temporal_patch_size: int = 2
  merge_size: int = 2
  resample: int = Image.Resampling.BICUBIC
  image_mean: tuple[float, ...] = OPENAI_CLIP_MEAN
  image_std: tuple[float, ...] = OPENAI_CLIP_STD
  do_rescale: bool = True
  rescale_factor: float = 1 / 255
  do_normalize: bool = True
  max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS

  @property
  def factor(self) -> int:
    return self.patch_size * self.merge_size

  def grid(self, height: int, width: int) -> tuple[int, int, int]:
    """(grid_t, grid_h, grid_w) in patches of an image of height x width pixels (`read_image_size` of a file);
    it costs grid_h * grid_w / merge_size^2 tokens."""
    h, w = smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels)
    return 1, h // self.patch_size, w // self.patch_size

  @classmethod
  def from_dict(cls, row: Mapping[str, Any], source: str = IMAGE_CONFIG, **overrides) -> "VisionPreprocessConfig":
    """From the JSON of a `preprocessor_config.json` (keys transformers reads; others are ignored)."""
    min_pixels, max_pixels = pixel_budget(row, cls.min_pixels, cls.max_pixels, source)
    fields = dict(min_pixels=min_pixels, max_pixels=max_pixels, **normalisation(row, source))
    return cls(**{**fields, **overrides})

  @classmethod
  def from_pretrained(cls, directory: str | os.PathLike, **overrides) -> "VisionPreprocessConfig":
    """The image processor settings of a checkpoint directory, as transformers' `AutoImageProcessor` reads them
    (`processor_config.json` nested entry, else `preprocessor_config.json`); defaults when it has neither.
    `overrides` replace single fields (e.g. max_pixels=...)."""
    row, source = read_processor_dict(directory, "image_processor")
    return cls.from_dict(row, source or f"{directory}/{IMAGE_CONFIG}", **overrides)


def smart_resize(
  height: int, width: int, factor: int = 28, min_pixels: int = 56 * 56, max_pixels: int = 28 * 28 * 1280
) -> tuple[int, int]:
  """Target (height, width): multiples of `factor`, area within [min_pixels, max_pixels], aspect kept
  (transformers' `qwen2_vl.image_processing_qwen2_vl.smart_resize`)."""
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


def normalize(x: np.ndarray, cfg) -> np.ndarray:
  """uint8 [..., H, W, C] -> float32 [..., C, H, W], rescaled and normalised as the PIL image processor does
  (rescale in float64 then cast, normalise in float32)."""
  x = np.moveaxis(x, -1, -3)
  if cfg.do_rescale:
    x = (x.astype(np.float64) * cfg.rescale_factor).astype(np.float32)
  else:
    x = x.astype(np.float32)
  if cfg.do_normalize:
    mean = np.asarray(cfg.image_mean, np.float32)[:, None, None]
    std = np.asarray(cfg.image_std, np.float32)[:, None, None]
    x = (x - mean) / std
  return x


def patchify(frames: np.ndarray, cfg) -> tuple[np.ndarray, np.ndarray]:
  """frames float32 [F, C, H, W] (F a multiple of temporal_patch_size) -> (patches, grid_thw)."""
  f, c, h, w = frames.shape
  p, m, tp = cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size
  gt, gh, gw = f // tp, h // p, w // p
  x = frames.reshape(gt, tp, c, gh // m, m, p, gw // m, m, p)
  x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
  return x.reshape(gt * gh * gw, c * tp * p * p), np.array([gt, gh, gw], np.int64)


def preprocess_image(
  image, cfg: VisionPreprocessConfig = VisionPreprocessConfig(), record: str | None = None
) -> tuple[np.ndarray, np.ndarray]:
  """One image (path, PIL or uint8 array) -> (patches float32 [gh * gw, patch_dim], grid_thw [1, gh, gw])."""
  image = load_image(image, cfg.max_image_pixels, record)
  h, w = smart_resize(image.height, image.width, cfg.factor, cfg.min_pixels, cfg.max_pixels)
  image = image.resize((w, h), resample=cfg.resample)  # transformers resizes even at equal size (a copy)
  x = normalize(np.asarray(image), cfg)
  frames = np.broadcast_to(x[None], (cfg.temporal_patch_size, *x.shape))  # a still image is duplicated in time
  return patchify(frames, cfg)
