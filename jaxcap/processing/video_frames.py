"""A video's frames: files probed and decoded with PyAV at the sampled frame indices (`jaxcap.processing.video`'s
rules, or a family's config), frame lists and arrays taken as they are, and the frames preprocessed into patches
as transformers' video processors do (see `jaxcap.processing.video` for the rules and the config)."""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np
from PIL import Image

from jaxcap.processing.resize import resize_bicubic_aa
from jaxcap.processing.video import (
  VideoClip,
  VideoPreprocessConfig,
)
from jaxcap.processing.image_decoding import array_to_rgb, load_image
from jaxcap.processing.vision import patchify


# --- decoding ---------------------------------------------------------------------------------------------


def _open_video(path, record: str | None):
  import av

  who = f"record {record!r}: " if record is not None else ""
  if not os.path.isfile(path):
    raise ValueError(f"{who}video {os.fspath(path)} does not exist; fix the path.")
  try:
    container = av.open(os.fspath(path))
  except Exception as e:  # noqa: BLE001 -- PyAV raises FFmpegError subclasses, OSError and ValueError
    raise ValueError(f"{who}cannot read video {os.fspath(path)!r}: {e}") from e
  if not container.streams.video:
    container.close()
    raise ValueError(f"{who}{os.fspath(path)} has no video stream; pass a video file (mp4, webm, mkv, ...).")
  return container


def probe_video(path: str | os.PathLike, record: str | None = None) -> tuple[int, float, int, int]:
  """(total_frames, video_fps, height, width) of a video file from its headers (frames counted from packets
  when the container does not say). Raises ValueError naming the file when it cannot be read."""
  with _open_video(path, record) as container:
    stream = container.streams.video[0]
    rate = stream.average_rate or stream.guessed_rate
    total = stream.frames
    if total <= 0:
      total = sum(1 for packet in container.demux(stream) if packet.size)
    return int(total), float(rate) if rate else 0.0, stream.codec_context.height, stream.codec_context.width


def video_file_grid(
  path: str | os.PathLike, cfg: VideoPreprocessConfig | None = None, record: str | None = None
) -> tuple[int, int, int]:
  """(grid_t, grid_h, grid_w) that `read_video` + `preprocess_video` will give a file with `cfg`'s sampling,
  from its headers only (for bucketing before decoding)."""
  cfg = cfg or VideoPreprocessConfig()
  total, video_fps, height, width = probe_video(path, record)
  return cfg.grid(cfg.frame_count(total, video_fps), height, width)


def read_video(
  path: str | os.PathLike,
  cfg: VideoPreprocessConfig | None = None,
  *,
  fps: float | None = None,
  min_frames: int | None = None,
  max_frames: int | None = None,
  nframes: int | None = None,
  resize: bool = False,
  record: str | None = None,
) -> VideoClip:
  """Decodes the frames of a video file that `cfg` samples (`cfg.frame_count`, `cfg.frame_indices`: for this class
  qwen-vl-utils' rule, see the module docstring; `Qwen3VideoPreprocessConfig`: transformers'), uint8 RGB.

  fps / min_frames / max_frames / nframes override `cfg`'s sampling. With `resize`, each sampled frame is resized
  to the processor's target as soon as it is decoded (memory stays small for long, large clips); the result is
  the same as resizing afterwards. Raises ValueError naming the file (and `record`) when it cannot be decoded."""
  cfg = cfg or VideoPreprocessConfig()
  who = f"record {record!r}: " if record is not None else ""
  path = os.fspath(path)
  total, video_fps, _, _ = probe_video(path, record)
  nframes = nframes if nframes is not None else cfg.num_frames
  for _ in range(2):  # a second pass only when the headers over-count the frames that actually decode
    if nframes is None and not video_fps:
      raise ValueError(f"{who}video {path} has no frame rate in its headers; pass nframes (frames to sample).")
    try:
      n = cfg.frame_count(total, video_fps, fps, min_frames, max_frames, nframes)
    except ValueError as e:
      raise ValueError(f"{who}video {path}: {e}") from None
    indices = cfg.frame_indices(total, n)
    frames, source, decoded = _decode(path, indices, cfg if resize else None, n, record)
    if len(frames) == n:
      sampled_fps = n / max(total, 1e-6) * video_fps if video_fps else (fps or cfg.fps)
      return VideoClip(np.stack(frames), sampled_fps, indices, total, video_fps, path, source if resize else None)
    if decoded == total:
      break
    total = decoded
  raise ValueError(f"{who}video {path}: decoded {decoded} frames but needed frame {indices[-1]}; the file is damaged.")


def _decode(path, indices: np.ndarray, cfg: VideoPreprocessConfig | None, n: int, record):
  """Frames at `indices` (sorted, maybe repeated), resized to `cfg`'s target when given; also the decoded size
  and how many frames were decoded."""
  wanted: dict[int, int] = {}
  for i in indices.tolist():
    wanted[i] = wanted.get(i, 0) + 1
  last = int(indices[-1])
  frames, source, count = [], None, 0
  with _open_video(path, record) as container:
    stream = container.streams.video[0]
    stream.thread_type = "AUTO"  # frame + slice threads: several times faster on long clips
    try:
      for frame in container.decode(stream):
        if count in wanted:
          rgb = frame.to_ndarray(format="rgb24")
          if source is None:
            source = rgb.shape[:2]
            target = cfg.target_size(*source, n) if cfg is not None else source
          if cfg is not None and rgb.shape[:2] != target:
            rgb = resize_bicubic_aa(rgb[None], *target)[0]
          frames.extend([rgb] * wanted[count])
        count += 1
        if count > last:
          break
    except Exception as e:  # noqa: BLE001 -- a damaged stream
      who = f"record {record!r}: " if record is not None else ""
      raise ValueError(f"{who}cannot decode video {path!r} at frame {count}: {e}") from e
  return frames, source, count


def load_video(
  source,
  cfg: VideoPreprocessConfig | None = None,
  *,
  fps: float | None = None,
  min_frames: int | None = None,
  max_frames: int | None = None,
  nframes: int | None = None,
  resize: bool = False,
  record: str | None = None,
) -> VideoClip:
  """A `VideoClip` from a video file (sampled, see `read_video`), an existing clip, a uint8 array [T, H, W, C]
  or a list of frames (paths, PIL images or uint8 arrays, all used). For frames, `fps` is their rate (default
  `cfg.fps`), as qwen-vl-utils takes it for frame lists."""
  cfg = cfg or VideoPreprocessConfig()
  if isinstance(source, VideoClip):
    return source
  if isinstance(source, (str, os.PathLike)):
    kw = dict(fps=fps, min_frames=min_frames, max_frames=max_frames, nframes=nframes, resize=resize, record=record)
    return read_video(source, cfg, **kw)
  if isinstance(source, np.ndarray) and source.ndim == 4:
    frames = [array_to_rgb(f) for f in source]
  elif isinstance(source, Sequence) and not isinstance(source, (str, bytes)):
    frames = [np.asarray(load_image(f, cfg.max_image_pixels, record)) for f in source]
  else:
    raise ValueError(
      f"cannot read a video from a {type(source).__name__}; pass a video file path, a uint8 array [T, H, W, 3] "
      "or a list of frames."
    )
  if not frames:
    raise ValueError("a video needs at least one frame")
  first = frames[0].shape[:2]
  if any(f.shape[:2] != first for f in frames):
    # frames of one clip share a size in transformers; resize the odd ones to the first (qwen-vl-utils resizes each)
    frames = [f if f.shape[:2] == first else np.asarray(Image.fromarray(f).resize(first[::-1], 3)) for f in frames]
  return VideoClip(np.stack(frames), float(fps if fps is not None else cfg.fps))


def preprocess_video(
  video, cfg: VideoPreprocessConfig | None = None, fps: float | None = None, record: str | None = None
) -> tuple[np.ndarray, np.ndarray]:
  """A video (file path, `VideoClip`, uint8 array [T, H, W, C] or list of frames) -> (patches float32
  [gt * gh * gw, patch_dim], grid_thw [gt, gh, gw]). The last frame is repeated to fill the final temporal
  patch, as transformers does."""
  cfg = cfg or VideoPreprocessConfig()
  clip = load_video(video, cfg, fps=fps, resize=True, record=record)
  frames = clip.frames
  target = cfg.target_size(*(clip.source_size or frames.shape[1:3]), len(frames))
  if frames.shape[1:3] != target:
    if clip.source_size is not None:
      raise ValueError(
        f"video {clip.path}: its frames were resized to {frames.shape[1:3]} for another video config than this "
        f"one ({target}); read it with the processor's config (read_video(..., processor.video_cfg))."
      )
    frames = resize_bicubic_aa(frames, *target)
  x = _normalize_video(frames, cfg)
  if pad := -len(x) % cfg.temporal_patch_size:
    x = np.concatenate([x, np.repeat(x[-1:], pad, axis=0)])
  return patchify(x, cfg)


def _normalize_video(frames: np.ndarray, cfg: VideoPreprocessConfig) -> np.ndarray:
  """uint8 [T, H, W, C] -> float32 [T, C, H, W], as transformers' torchvision backend `rescale_and_normalize`:
  rescale fused into mean / std (float32 mean * (1 / rescale_factor)), then (x - mean) / std in float32."""
  x = np.ascontiguousarray(np.moveaxis(frames, -1, 1)).astype(np.float32)
  if cfg.do_normalize:
    scale = np.float32(1.0 / cfg.rescale_factor) if cfg.do_rescale else np.float32(1.0)
    mean = (np.asarray(cfg.image_mean, np.float32) * scale)[:, None, None]
    std = (np.asarray(cfg.image_std, np.float32) * scale)[:, None, None]
    return (x - mean) / std
  return x * np.float32(cfg.rescale_factor) if cfg.do_rescale else x
