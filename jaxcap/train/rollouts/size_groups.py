"""Batches of similar image sizes: records ordered so that each step's images pad little to their bucket.

With native resolution a step's prompt length is its largest image's, so one large image makes every row of the
step pay for it. As `transformers`' `group_by_length` does for text, each window of `group` global batches of the
epoch's shuffled order is sorted by size, cut into batches, and the window's batches shuffled again: batches hold
similar sizes, and their order (and every record's epoch) stays random.
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

import numpy as np

from jaxcap.data.records import ImageRecord


def record_patches(
  records: Sequence[ImageRecord], vision_cfg, video_cfg=None, image_size: int = 0, threads: int = 8
) -> np.ndarray:
  """Vision patches per record (int64 [N]) as the processor will make them, from file headers only (EXIF rotation
  applied; a video file: the frames its sampling takes; a frame list: its frames). Unreadable files count 0 here;
  reading them fails by name later."""
  from jaxcap.processing.video_frames import video_file_grid
  from jaxcap.processing.image_decoding import read_image_size

  def one(record: ImageRecord) -> int:
    try:
      if record.is_video and not record.frames:  # a video file
        return int(np.prod(video_file_grid(record.image, video_cfg, record=record.id)))
      if image_size:
        h = w = image_size
      else:
        h, w = read_image_size(record.frames[0] if record.frames else record.image, record=record.id)
    except Exception:  # a bad file: sorted first here, reported by name where it is decoded
      return 0
    return max(1, len(record.frames)) * int(np.prod(vision_cfg.grid(h, w)))

  with ThreadPoolExecutor(max(1, threads)) as pool:
    return np.fromiter(pool.map(one, records), np.int64, len(records))


def size_grouped_order(sizes: np.ndarray, global_batch: int, group: int, seed: int, epoch: int) -> np.ndarray:
  """A permutation of range(len(sizes)) for `epoch`: shuffled, each window of `group` global batches sorted by
  size and cut into batches, the window's whole batches shuffled (a short final batch stays last)."""
  sizes = np.asarray(sizes)
  rng = np.random.default_rng([int(seed), int(epoch)])
  perm = rng.permutation(len(sizes))
  window = max(1, group) * global_batch
  out = []
  for start in range(0, len(perm), window):
    chunk = perm[start : start + window]
    chunk = chunk[np.argsort(sizes[chunk], kind="stable")]
    whole = len(chunk) // global_batch
    batches = [chunk[i * global_batch : (i + 1) * global_batch] for i in range(whole)]
    out.extend(batches[i] for i in rng.permutation(whole))
    out.append(chunk[whole * global_batch :])
  return np.concatenate(out)


def grouped_records(records: Sequence[ImageRecord], sizes, global_batch: int, group: int, seed: int):
  """fn(index, _) -> the record at position `index` of the endless epoch-by-epoch grouped order (for grain's
  `map_with_index` over a repeated range)."""
  n = len(records)

  @functools.lru_cache(maxsize=2)
  def order(epoch: int) -> np.ndarray:
    return size_grouped_order(sizes, global_batch, group, seed, epoch)

  def pick(index: int, _) -> ImageRecord:
    epoch, pos = divmod(int(index), n)
    return records[int(order(epoch)[pos])]

  return pick
