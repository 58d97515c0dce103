"""Multimodal RoPE position ids (host side, numpy), equal to `transformers`' `Qwen2_5_VLModel.get_rope_index`."""

from __future__ import annotations

import itertools

import numpy as np

from jaxcap.models.config import Qwen25VLConfig


def rope_index(
  cfg: Qwen25VLConfig,
  input_ids: np.ndarray,
  attention_mask: np.ndarray | None = None,
  image_grid_thw: np.ndarray | None = None,
  video_grid_thw: np.ndarray | None = None,
  second_per_grid_ts: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
  """3D position ids for a batch.

  input_ids int [B, T]; attention_mask [B, T] (1 = real token; padding may be left or right). Grids are consumed
  in order across the batch, as the processor emits them. Text tokens advance all three ids together; an
  image/video's (t, h, w) ids start at the running position, with video time ids spaced by
  `tokens_per_second * second_per_grid_ts` (seconds per temporal patch; float32, as transformers computes).
  Returns positions int32 [3, B, T] (0 on padding) and rope_deltas int32 [B] (max position + 1 - number of real
  tokens), used to continue positions when decoding.
  """
  input_ids = np.asarray(input_ids)
  b, t = input_ids.shape
  mask = np.ones((b, t), bool) if attention_mask is None else np.asarray(attention_mask).astype(bool)
  m = cfg.vision.spatial_merge_size
  grids = {
    1: iter(np.asarray(image_grid_thw).tolist() if image_grid_thw is not None else []),
    2: iter(np.asarray(video_grid_thw).tolist() if video_grid_thw is not None else []),
  }
  # float32, as the processor's `second_per_grid_ts` tensor: transformers multiplies in float32 and truncates, and
  # float64 products land just below an integer where float32 rounds onto it (25 fps clips, long videos)
  seconds = iter(np.asarray(second_per_grid_ts, np.float32) if second_per_grid_ts is not None else [])
  positions = np.zeros((3, b, t), np.int64)
  deltas = np.zeros((b,), np.int64)
  for row in range(b):
    ids = input_ids[row][mask[row]]
    types = np.where(ids == cfg.image_token_id, 1, np.where(ids == cfg.video_token_id, 2, 0))
    pieces, current = [], 0
    for kind, group in itertools.groupby(range(len(ids)), key=lambda i: types[i]):
      n = len(list(group))
      if kind == 0:
        pieces.append(np.broadcast_to(np.arange(n) + current, (3, n)))
        current += n
        continue
      try:
        gt, gh, gw = next(grids[kind])
      except StopIteration:
        raise ValueError(
          f"row {row} has more {'image' if kind == 1 else 'video'} placeholders than grids "
          "were given; pass image_grid_thw / video_grid_thw from jaxcap.processing."
        ) from None
      interval = np.float32(cfg.vision.tokens_per_second) * next(seconds, np.float32(1)) if kind == 2 else 1
      lt, lh, lw = gt, gh // m, gw // m
      if n != lt * lh * lw:
        raise ValueError(
          f"row {row}: a run of {n} vision placeholder tokens does not match its grid "
          f"{gt}x{gh}x{gw} ({lt * lh * lw} tokens); build prompts with jaxcap.processing."
        )
      tt = (np.arange(lt, dtype=np.float32) * np.float32(interval)).astype(np.int64)  # truncation, as .long()
      tg, hg, wg = np.meshgrid(tt, np.arange(lh) + current, np.arange(lw) + current, indexing="ij")
      pieces.append(np.stack([tg.reshape(-1) + current, hg.reshape(-1), wg.reshape(-1)]))
      current += max(gh, gw) // m
    pos = np.concatenate(pieces, axis=1) if pieces else np.zeros((3, 0), np.int64)
    positions[:, row, mask[row]] = pos
    deltas[row] = (pos.max() + 1 if pos.size else 0) - len(ids)
  return positions.astype(np.int32), deltas.astype(np.int32)


def qwen3vl_rope_index(
  cfg: Qwen25VLConfig,
  input_ids: np.ndarray,
  attention_mask: np.ndarray | None = None,
  image_grid_thw: np.ndarray | None = None,
  video_grid_thw: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
  """3D position ids as `transformers`' `Qwen3VLModel.get_rope_index`: Qwen3-VL separates a video's frames by
  text timestamps, so each temporal patch is an item of its own (grid [1, h, w], no time scaling); the rest is
  Qwen2.5-VL's `rope_index`. Returns positions int32 [3, B, T] and rope_deltas int32 [B]."""
  if video_grid_thw is not None:
    grids = np.asarray(video_grid_thw).reshape(-1, 3)
    video_grid_thw = np.repeat(grids, grids[:, 0], axis=0)
    video_grid_thw[:, 0] = 1
  return rope_index(cfg, input_ids, attention_mask, image_grid_thw, video_grid_thw)
