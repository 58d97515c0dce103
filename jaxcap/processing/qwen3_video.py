"""Video preprocessing equal to transformers' `Qwen3VLVideoProcessor` (what Qwen3-VL checkpoints use).

What differs from Qwen2.5-VL's (`jaxcap.processing.video`):
- sampling: n = int(total_frames / video_fps * fps), clamped to [min_frames, max_frames] and to total_frames (not
  rounded to the temporal patch: an odd count gets its last frame repeated); the frames taken are
  `np.linspace(0, total_frames - 1, n).round()` (float64, ties to even);
- pixel budget: `size` {shortest_edge, longest_edge} bounds the whole clip (t * h * w, t the frame count rounded to
  the temporal patch), not each frame; frames smaller than patch * merge on a side are first scaled up to it; with
  `cap_pixels_per_frame` each frame gets max(min(max_video_tokens * factor^2, longest_edge // n),
  int(shortest_edge * 1.05)) pixels (max_video_tokens is per frame here, 768 by default). transformers' default for
  `cap_pixels_per_frame` (unset) is off, and Hub checkpoints do not set it;
- the processor writes each temporal patch's time as text (`jaxcap.processing.chat.timestamped_video_pieces`).
Resizing (torch's antialiased bicubic on uint8), rescale / normalise and patchify are Qwen2.5-VL's.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar, Mapping

import numpy as np

from jaxcap.processing.video import VideoPreprocessConfig
from jaxcap.processing.vision import VisionPreprocessConfig


def qwen3_video_resize(
  num_frames: int,
  height: int,
  width: int,
  temporal_factor: int = 2,
  factor: int = 32,
  min_pixels: int = 128 * 32 * 32,
  max_pixels: int = 32 * 32 * 768,
) -> tuple[int, int]:
  """Target (height, width) of every frame: multiples of `factor`, the clip's t * h * w within [min_pixels,
  max_pixels] (t: num_frames rounded to `temporal_factor`), aspect kept (transformers'
  `video_processing_qwen3_vl.smart_resize`)."""
  if num_frames < temporal_factor:
    raise ValueError(
      f"a video of {num_frames} sampled frame(s) is shorter than the temporal patch ({temporal_factor}); pass a "
      "longer clip (a single frame is an image)."
    )
  if height < factor or width < factor:
    scale = max(factor / height, factor / width)
    height, width = int(height * scale), int(width * scale)
  if max(height, width) / min(height, width) > 200:
    raise ValueError(f"video frames of {height}x{width} have aspect ratio above 200; crop or pad them first.")
  h_bar = round(height / factor) * factor
  w_bar = round(width / factor) * factor
  t_bar = round(num_frames / temporal_factor) * temporal_factor
  if t_bar * h_bar * w_bar > max_pixels:
    beta = math.sqrt((num_frames * height * width) / max_pixels)
    h_bar = max(factor, math.floor(height / beta / factor) * factor)
    w_bar = max(factor, math.floor(width / beta / factor) * factor)
  elif t_bar * h_bar * w_bar < min_pixels:
    beta = math.sqrt(min_pixels / (num_frames * height * width))
    h_bar = math.ceil(height * beta / factor) * factor
    w_bar = math.ceil(width * beta / factor) * factor
  return h_bar, w_bar


@dataclasses.dataclass(frozen=True)
class Qwen3VideoPreprocessConfig(VideoPreprocessConfig):
  """Qwen3-VL's video settings; defaults are transformers' `Qwen3VLVideoProcessor`'s. min_pixels / max_pixels
  bound the whole clip (pixels, summed over frames); max_video_tokens caps each frame (tokens) when
  cap_pixels_per_frame (total_pixels, Qwen2.5-VL's clip budget, is not used: max_pixels is)."""

  min_pixels: int = 128 * 32 * 32
  max_pixels: int = 32 * 32 * 768
  patch_size: int = 16
  image_mean: tuple[float, ...] = (0.5, 0.5, 0.5)
  image_std: tuple[float, ...] = (0.5, 0.5, 0.5)
  cap_pixels_per_frame: bool = False
  max_video_tokens: int = 768
  per_frame_floor: ClassVar[bool] = False  # min_pixels bounds the whole clip

  def frame_max_pixels(self, num_frames: int) -> int:
    """Each frame's share of the clip budget (pixels) for `num_frames` frames."""
    if not self.cap_pixels_per_frame:
      return self.max_pixels // max(num_frames, 1)
    cap = self.max_video_tokens * self.factor * self.factor
    return max(min(cap, self.max_pixels // max(num_frames, 1)), int(self.min_pixels * 1.05))

  def target_size(self, height: int, width: int, num_frames: int) -> tuple[int, int]:
    max_pixels = self.frame_max_pixels(num_frames) * num_frames if self.cap_pixels_per_frame else self.max_pixels
    return qwen3_video_resize(
      num_frames, height, width, self.temporal_patch_size, self.factor, self.min_pixels, max_pixels
    )

  def frame_count(
    self,
    total_frames: int,
    video_fps: float,
    fps: float | None = None,
    min_frames: int | None = None,
    max_frames: int | None = None,
    nframes: int | None = None,
  ) -> int:
    """transformers' `Qwen3VLVideoProcessor.sample_frames` count: `nframes` (else `num_frames`) as given, else
    int(total / video_fps * fps) clamped to [min_frames, max_frames] and total."""
    n = nframes if nframes is not None else self.num_frames
    if n is None:
      if not video_fps:
        raise ValueError("the video has no frame rate; pass nframes (frames to sample).")
      n = int(total_frames / video_fps * (self.fps if fps is None else fps))
      lo = self.min_frames if min_frames is None else min_frames
      n = min(max(n, lo), self.max_frames if max_frames is None else max_frames, total_frames)
    if n < self.temporal_patch_size:
      raise ValueError(
        f"a video of {total_frames} frames gives {n} sampled frame(s), fewer than the temporal patch "
        f"({self.temporal_patch_size}); pass a longer clip (a single frame is an image)."
      )
    return int(n)

  def frame_indices(self, total_frames: int, nframes: int) -> np.ndarray:
    """int64 [nframes]: `np.linspace(0, total_frames - 1, nframes).round()`, as transformers samples."""
    return np.linspace(0, total_frames - 1, nframes).round().astype(np.int64)

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
  ) -> "Qwen3VideoPreprocessConfig":
    """`VideoPreprocessConfig.with_sampling` in Qwen3-VL's terms: the clip's budget `total_pixels` is max_pixels
    (transformers' size.longest_edge); each frame's ceiling is max_video_tokens (whole merged tokens:
    max_frame_pixels // factor^2) with cap_pixels_per_frame on; there is no per-frame floor (min_pixels bounds the
    whole clip), so `min_frame_pixels` raises ValueError, as does a ceiling below the floor the cap keeps
    (int(1.05 x min_pixels))."""
    name = lambda arg: (names or {}).get(arg, arg)
    if min_frame_pixels is not None:
      raise ValueError(
        f"{name('min_frame_pixels')}={min_frame_pixels}: Qwen3-VL's video processor has no per-frame pixel floor "
        f"(its min_pixels={self.min_pixels} bounds the whole clip); unset {name('min_frame_pixels')}"
      )
    changes = dict(fps=None if fps is None else float(fps), min_frames=min_frames, max_frames=max_frames)
    changes.update(max_pixels=total_pixels)
    if max_frame_pixels is not None:
      floor = max(int(self.min_pixels * 1.05), self.factor * self.factor)
      if max_frame_pixels < floor:
        raise ValueError(
          f"{name('max_frame_pixels')}={max_frame_pixels} is below the per-frame floor {floor} px that Qwen3-VL's "
          f"per-frame cap keeps (int(1.05 x min_pixels={self.min_pixels}), min_pixels bounding the whole clip); "
          f"raise {name('max_frame_pixels')} to at least {floor}"
        )
      changes.update(max_video_tokens=max_frame_pixels // (self.factor * self.factor), cap_pixels_per_frame=True)
    return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

  @classmethod
  def from_image(cls, cfg: VisionPreprocessConfig, **overrides) -> "Qwen3VideoPreprocessConfig":
    """The image geometry and normalisation with this class's video budget and sampling (the budgets mean
    different things: the image one bounds one picture, this one a whole clip)."""
    names = ("patch_size", "temporal_patch_size", "merge_size", "image_mean", "image_std", "do_rescale")
    names += ("rescale_factor", "do_normalize", "max_image_pixels")
    return cls(**{**{n: getattr(cfg, n) for n in names}, **overrides})
