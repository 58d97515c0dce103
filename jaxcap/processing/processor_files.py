"""A `Processor`'s image and video settings written as the Hugging Face processor files of a checkpoint directory
(`preprocessor_config.json`, `video_preprocessor_config.json`), so that transformers' `AutoProcessor` and
`Processor.from_pretrained` read back the settings a policy was trained with (pixel budgets, geometry,
normalisation, frame sampling).

Budgets are in pixels (min_pixels / max_pixels: a resized image's area, or each video frame's); frame sampling in
frames per second and frames.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any

from jaxcap.models.families import family_of_config
from jaxcap.processing.rules import PROCESSOR_RULES
from jaxcap.processing.vision import IMAGE_CONFIG, PROCESSOR_CONFIG, VisionPreprocessConfig, smart_resize

VIDEO_CONFIG = "video_preprocessor_config.json"


def _common(cfg) -> dict[str, Any]:
  """The fields the image and video processors share, as transformers names them."""
  return {
    "min_pixels": int(cfg.min_pixels),
    "max_pixels": int(cfg.max_pixels),
    # transformers v5 reads `size`; the top-level pair above wins over it, in jaxcap's reader and in transformers'
    "size": {"shortest_edge": int(cfg.min_pixels), "longest_edge": int(cfg.max_pixels)},
    "patch_size": int(cfg.patch_size),
    "temporal_patch_size": int(cfg.temporal_patch_size),
    "merge_size": int(cfg.merge_size),
    "image_mean": [float(v) for v in cfg.image_mean],
    "image_std": [float(v) for v in cfg.image_std],
    "do_rescale": bool(cfg.do_rescale),
    "rescale_factor": float(cfg.rescale_factor),
    "do_normalize": bool(cfg.do_normalize),
    "do_resize": True,
    "do_convert_rgb": True,
  }


def image_processor_dict(cfg: VisionPreprocessConfig, classes: tuple[str, str, str]) -> dict[str, Any]:
  """preprocessor_config.json of image settings `cfg`; `classes`: (processor, image, video) class names
  (`ProcessorRules.hf_classes`)."""
  return {
    **_common(cfg),
    "resample": int(cfg.resample),
    "image_processor_type": classes[1],
    "processor_class": classes[0],
  }


def video_processor_dict(cfg, classes: tuple[str, str, str]) -> dict[str, Any]:
  """video_preprocessor_config.json of video settings `cfg` (a `VideoPreprocessConfig`). A clip budget given in
  pixels (`total_pixels`, which transformers has no field for) is written as the largest `max_video_tokens` whose
  budget stays within it (transformers' int(max_video_tokens * (patch * merge)^2 * 0.9) pixels)."""
  tokens = int(cfg.max_video_tokens)
  if cfg.total_pixels is not None:
    tokens = max(1, math.floor(cfg.total_pixels / (cfg.factor * cfg.factor * 0.9)))
  row = {
    **_common(cfg),
    "fps": float(cfg.fps),
    "min_frames": int(cfg.min_frames),
    "max_frames": int(cfg.max_frames),
    "cap_pixels_per_frame": bool(cfg.cap_pixels_per_frame),
    "max_video_tokens": tokens,
    "video_processor_type": classes[2],
    "processor_class": classes[0],
  }
  if cfg.num_frames is not None:
    row["num_frames"] = int(cfg.num_frames)
  return row


def square_budget(cfg, side: int):
  """Image or video settings `cfg` with the pixel budget of images (frames) resized to `side` x `side` (a run's
  `data.image_size`; 0: `cfg` as is): at most the area such a square had after `cfg`'s own resize (84 px -> 84 x
  84 at Qwen2.5-VL's 28 px factor, 96 x 96 at Qwen3-VL's 32), so a native-size image gets about as many visual
  tokens as a training image had (a square one exactly as many). A video config whose floor bounds the whole clip
  (Qwen3-VL's, `per_frame_floor` False) is kept: its frames' budget is not one image's."""
  if side <= 0 or not getattr(cfg, "per_frame_floor", True):
    return cfg
  area = math.prod(smart_resize(side, side, cfg.factor, cfg.min_pixels, cfg.max_pixels))
  return dataclasses.replace(cfg, min_pixels=min(cfg.min_pixels, area), max_pixels=min(cfg.max_pixels, area))


def save_processor_configs(processor, directory: str | os.PathLike, square_side: int = 0) -> list[Path]:
  """Writes `processor`'s image and video settings into `directory` as its preprocessor_config.json and
  video_preprocessor_config.json (fields of files already there, e.g. copied from the base checkpoint, kept where
  jaxcap has no value for them), and into a processor_config.json's nested entries when there is one (transformers
  reads those first). `square_side` > 0: the run resized every image and frame to that square
  (`data.image_size`), recorded as the pixel budget of that area (`square_budget`). Returns the files written."""
  directory = Path(directory)
  classes = PROCESSOR_RULES[family_of_config(processor.cfg).processor].hf_classes
  rows = {
    "image_processor": image_processor_dict(square_budget(processor.vision_cfg, square_side), classes),
    "video_processor": video_processor_dict(square_budget(processor.video_cfg, square_side), classes),
  }
  written = []
  for kind, name in (("image_processor", IMAGE_CONFIG), ("video_processor", VIDEO_CONFIG)):
    path = directory / name
    old = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps({**old, **rows[kind]}, indent=2) + "\n")
    written.append(path)
  nested = directory / PROCESSOR_CONFIG
  if nested.is_file():
    row = json.loads(nested.read_text())
    for kind in rows:
      if isinstance(row.get(kind), dict):
        row[kind] = {**row[kind], **rows[kind]}
    nested.write_text(json.dumps(row, indent=2) + "\n")
    written.append(nested)
  return written
