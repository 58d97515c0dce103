"""Videos for Qwen2.5-VL: files decoded with PyAV and sampled as qwen-vl-utils does, frames preprocessed as
transformers' `Qwen2VLVideoProcessor` does.

Frame sampling (qwen-vl-utils `vision_process.smart_nframes` / `_read_video_decord`, the reference for
Qwen2.5-VL): nframes = total_frames / video_fps * fps, clamped to [ceil2(min_frames), floor2(max_frames)] and
to total_frames, floored to a multiple of the temporal patch (FRAME_FACTOR 2); the frames taken are
`round(linspace(0, total_frames - 1, nframes))` (float32, as torch.linspace computes); the sampled rate is
`nframes / total_frames * video_fps` and `second_per_grid_ts = temporal_patch_size / sampled_fps`, as
transformers' `Qwen2_5_VLProcessor` (`VideoMetadata.sampled_fps`) computes it. transformers' own sampler
(`Qwen2VLVideoProcessor.sample_frames`) takes `floor(arange(0, total, total / nframes))` instead; frames given
as a list are used as they are.

Pixel budget (transformers' `cap_pixels_per_frame=True`, which mirrors qwen-vl-utils' VIDEO_TOTAL_PIXELS): each
frame gets at most max(min(max_pixels, total_pixels * temporal_patch_size // nframes), int(min_pixels * 1.05))
pixels, total_pixels (the clip's budget) as given (qwen-vl-utils' per-video `total_pixels`), else transformers'
int(max_video_tokens * (patch * merge)^2 * 0.9) (128,000 tokens by default), then
`smart_resize`. Resizing is torch's antialiased bicubic on uint8 (what torchvision's `resize` runs on the CPU for
uint8 video tensors), reimplemented here in numpy to the bit; rescale / normalise follow transformers'
torchvision backend (uint8 -> float32, minus mean * 255, over std * 255).

Output: patches float32 [grid_t * grid_h * grid_w, C * temporal_patch * patch^2], grid_thw int [3].
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, ClassVar, Mapping

import numpy as np
from PIL import Image

from jaxcap.processing.image_decoding import DEFAULT_MAX_IMAGE_PIXELS
from jaxcap.processing.vision import (
  OPENAI_CLIP_MEAN,
  OPENAI_CLIP_STD,
  VisionPreprocessConfig,
  normalisation,
  pixel_budget,
  read_processor_dict,
  smart_resize,
)

# qwen-vl-utils' defaults (vision_process.py) and transformers' Qwen2VLVideoProcessor class defaults.
# The frame-sampling settings as the run config's data block (`data.video_fps`, ...) and the annotator's flags
# (`--video_fps`, ...) name them -> `VideoPreprocessConfig.with_sampling`'s arguments: one rule for both
SAMPLING_SETTINGS = {
  "video_fps": "fps",
  "video_min_frames": "min_frames",
  "video_max_frames": "max_frames",
  "video_min_pixels": "min_frame_pixels",
  "video_max_pixels": "max_frame_pixels",
  "video_total_pixels": "total_pixels",
}
FRAME_FACTOR = 2
FPS = 2.0
FPS_MIN_FRAMES = 4
FPS_MAX_FRAMES = 768
VIDEO_MIN_PIXELS = 128 * 28 * 28
VIDEO_MAX_PIXELS = 768 * 28 * 28
MAX_VIDEO_TOKENS = 128_000


@dataclasses.dataclass(frozen=True)
class VideoPreprocessConfig:
  """Video pixel budget, geometry, normalisation and frame sampling; defaults are transformers'
  `Qwen2VLVideoProcessor`'s and qwen-vl-utils' (fps 2, 4..768 frames, a 128k-token budget across frames).

  min_pixels / max_pixels bound each frame's resized area (pixels); total_pixels is the clip's budget, shared over
  its frames when cap_pixels_per_frame (None: transformers' int(max_video_tokens * factor^2 * 0.9), `clip_pixels`);
  fps is the sampling rate for files (frames per second); num_frames, when set, samples that many frames instead."""

  min_pixels: int = VIDEO_MIN_PIXELS
  max_pixels: int = VIDEO_MAX_PIXELS
  patch_size: int = 14
  temporal_patch_size: int = 2
  merge_size: int = 2
  resample: int = Image.Resampling.BICUBIC
  image_mean: tuple[float, ...] = OPENAI_CLIP_MEAN
  image_std: tuple[float, ...] = OPENAI_CLIP_STD
  do_rescale: bool = True
  rescale_factor: float = 1 / 255
  do_normalize: bool = True
  fps: float = FPS
  min_frames: int = FPS_MIN_FRAMES
  max_frames: int = FPS_MAX_FRAMES
  num_frames: int | None = None
  cap_pixels_per_frame: bool = True
  max_video_tokens: int = MAX_VIDEO_TOKENS
  max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS  # for frames given as image files
  total_pixels: int | None = None
  per_frame_floor: ClassVar[bool] = True  # min_pixels bounds each frame (`with_sampling`'s min_frame_pixels)

  def __post_init__(self):
    if self.resample != Image.Resampling.BICUBIC:
      raise ValueError(
        f"video resample={self.resample}: jaxcap implements bicubic (3) only, as Qwen2.5-VL's configs use; "
        "remove 'resample' from the video processor config or set it to 3."
      )

  @property
  def factor(self) -> int:
    return self.patch_size * self.merge_size

  @property
  def clip_pixels(self) -> int:
    """The pixel budget of a whole clip: total_pixels, else transformers' int(max_video_tokens * factor^2 * 0.9)."""
    if self.total_pixels is not None:
      return self.total_pixels
    return int(self.max_video_tokens * self.factor * self.factor * 0.9)

  def frame_max_pixels(self, num_frames: int) -> int:
    """Each frame's pixel cap for a clip of `num_frames` frames (before temporal padding)."""
    if not self.cap_pixels_per_frame:
      return self.max_pixels
    share = self.clip_pixels * self.temporal_patch_size // max(num_frames, 1)
    return max(min(self.max_pixels, share), int(self.min_pixels * 1.05))

  def target_size(self, height: int, width: int, num_frames: int) -> tuple[int, int]:
    """(height, width) every frame of a `num_frames`-frame clip of `height` x `width` is resized to."""
    return smart_resize(height, width, self.factor, self.min_pixels, self.frame_max_pixels(num_frames))

  def frame_count(
    self,
    total_frames: int,
    video_fps: float,
    fps: float | None = None,
    min_frames: int | None = None,
    max_frames: int | None = None,
    nframes: int | None = None,
  ) -> int:
    """How many frames to sample from a file of `total_frames` at `video_fps` (qwen-vl-utils' `smart_nframes`);
    the arguments override this config's sampling."""
    pick = lambda value, default: default if value is None else value
    return smart_nframes(
      total_frames,
      video_fps,
      pick(fps, self.fps),
      pick(min_frames, self.min_frames),
      pick(max_frames, self.max_frames),
      pick(nframes, self.num_frames),
      self.temporal_patch_size,
    )

  def with_sampling(
    self,
    *,
    fps: float | None = None,
    min_frames: int | None = None,
    max_frames: int | None = None,
    min_frame_pixels: int | None = None,
    max_frame_pixels: int | None = None,
    total_pixels: int | None = None,
    names: Mapping[str, str] | None = None,
  ) -> "VideoPreprocessConfig":
    """This config with other frame sampling and pixel budget, each None keeping this config's own: `fps` (frames
    per second sampled from a file), `min_frames` / `max_frames`, each frame's pixel floor / ceiling, and the
    clip's pixel budget (`total_pixels`, shared over its frames: turns `cap_pixels_per_frame` on, which applies it).
    `names`: what errors call the arguments (e.g. the run config's fields). Raises ValueError where a given per-frame
    bound leaves the ceiling below the floor (which would silently win where the clip budget binds)."""
    name = lambda arg: (names or {}).get(arg, arg)
    changes = dict(fps=None if fps is None else float(fps), min_frames=min_frames, max_frames=max_frames)
    changes.update(min_pixels=min_frame_pixels, max_pixels=max_frame_pixels)
    if total_pixels is not None:
      changes.update(total_pixels=int(total_pixels), cap_pixels_per_frame=True)
    out = dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})
    if (min_frame_pixels is not None or max_frame_pixels is not None) and out.max_pixels < out.min_pixels:
      raise ValueError(
        f"each frame's pixel ceiling {name('max_frame_pixels')}={out.max_pixels} is below its floor, "
        f"{out.min_pixels} px ({'given' if min_frame_pixels is not None else 'the min_pixels kept'}); "
        f"raise {name('max_frame_pixels')} or set {name('min_frame_pixels')} lower"
      )
    return out

  def frame_indices(self, total_frames: int, nframes: int) -> np.ndarray:
    """int64 [nframes]: which frames of the file to take (`sample_indices`)."""
    return sample_indices(total_frames, nframes)

  def grid(self, num_frames: int, height: int, width: int) -> tuple[int, int, int]:
    """(grid_t, grid_h, grid_w) in patches of `num_frames` sampled frames of height x width pixels (for a file:
    `smart_nframes` of `probe_video`'s counts); it costs the product / merge_size^2 tokens."""
    h, w = self.target_size(height, width, num_frames)
    return -(-num_frames // self.temporal_patch_size), h // self.patch_size, w // self.patch_size

  @classmethod
  def from_dict(cls, row: Mapping[str, Any], source: str = "video_preprocessor_config.json", **overrides):
    """From the JSON of a video processor config (keys transformers reads; others are ignored)."""
    min_pixels, max_pixels = pixel_budget(row, cls.min_pixels, cls.max_pixels, source)
    fields: dict[str, Any] = dict(min_pixels=min_pixels, max_pixels=max_pixels, **normalisation(row, source))
    for key, cast in (("fps", float), ("min_frames", int), ("max_frames", int), ("num_frames", int)):
      if row.get(key) is not None:
        fields[key] = cast(row[key])
    if row.get("cap_pixels_per_frame") is not None:  # transformers' None (its deprecated default) means False
      fields["cap_pixels_per_frame"] = bool(row["cap_pixels_per_frame"])
    if row.get("max_video_tokens") is not None:
      fields["max_video_tokens"] = int(row["max_video_tokens"])
    return cls(**{**fields, **overrides})

  @classmethod
  def from_image(cls, cfg: VisionPreprocessConfig, **overrides) -> "VideoPreprocessConfig":
    """The image settings (pixel budget per frame, geometry, normalisation) with video sampling defaults."""
    names = ("min_pixels", "max_pixels", "patch_size", "temporal_patch_size", "merge_size")
    names += ("image_mean", "image_std", "do_rescale", "rescale_factor", "do_normalize", "max_image_pixels")
    return cls(**{**{n: getattr(cfg, n) for n in names}, **overrides})

  @classmethod
  def from_pretrained(
    cls, directory: str | os.PathLike, image: VisionPreprocessConfig | None = None, **overrides
  ) -> "VideoPreprocessConfig":
    """The video processor settings of a checkpoint directory with transformers' priority
    (`processor_config.json` nested entry, `video_preprocessor_config.json`, then `preprocessor_config.json`).
    A directory with none of them gets the image settings (`image`, else defaults) for each frame."""
    row, source = read_processor_dict(directory, "video_processor")
    if source is None:
      return cls.from_image(image or VisionPreprocessConfig.from_pretrained(directory), **overrides)
    return cls.from_dict(row, source, **overrides)


@dataclasses.dataclass
class VideoClip:
  """Sampled frames of a video and where they came from.

  frames: uint8 [T, H, W, 3]; fps: the rate of `frames` (frames per second; for a file the sampled rate
  nframes / total_frames * video_fps); indices int64 [T]: frame numbers in the file; source_size: (H, W) of the
  decoded frames when `frames` were already resized to the processor's target."""

  frames: np.ndarray
  fps: float
  indices: np.ndarray | None = None
  total_frames: int | None = None
  video_fps: float | None = None
  path: str | None = None
  source_size: tuple[int, int] | None = None

  @property
  def timestamps(self) -> np.ndarray:
    """float64 [T]: each frame's time in the file (seconds), as transformers' `VideoMetadata.timestamps`."""
    if self.indices is None or not self.video_fps:
      return np.arange(len(self.frames)) / self.fps
    return self.indices / self.video_fps


def smart_nframes(
  total_frames: int,
  video_fps: float,
  fps: float = FPS,
  min_frames: int = FPS_MIN_FRAMES,
  max_frames: int = FPS_MAX_FRAMES,
  nframes: int | None = None,
  factor: int = FRAME_FACTOR,
) -> int:
  """How many frames to sample from a file of `total_frames` frames at `video_fps` (qwen-vl-utils'
  `smart_nframes`): `nframes` rounded to `factor` when given, else total / video_fps * fps clamped to
  [ceil(min_frames), floor(min(max_frames, total))] (multiples of `factor`) and to total, floored to `factor`."""
  if nframes is not None:
    n = round(nframes / factor) * factor
  else:
    lo = math.ceil(min_frames / factor) * factor
    hi = math.floor(min(max_frames, total_frames) / factor) * factor
    n = total_frames / video_fps * fps
    n = math.floor(min(min(max(n, lo), hi), total_frames) / factor) * factor
  if not factor <= n <= total_frames:
    raise ValueError(
      f"a video of {total_frames} frames cannot give {n} sampled frames (need {factor} <= n <= {total_frames}); "
      f"pass a clip of at least {factor} frames (a single frame is an image)."
    )
  return n


def sample_indices(total_frames: int, nframes: int) -> np.ndarray:
  """int64 [nframes]: `torch.linspace(0, total_frames - 1, nframes).round()` (float32, ties to even)."""
  if nframes == 1:
    return np.zeros(1, np.int64)
  end = np.float32(total_frames - 1)
  step = np.float32(end / np.float32(nframes - 1))
  i = np.arange(nframes)
  half = nframes // 2  # torch fills the second half backwards from `end`
  values = np.where(i < half, step * i.astype(np.float32), end - step * (nframes - 1 - i).astype(np.float32)).astype(
    np.float32
  )
  return np.round(values).astype(np.int64)
