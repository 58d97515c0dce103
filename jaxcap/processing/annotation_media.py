"""The annotator's media: each image's or video's processed size from its file header (to order a folder by size),
and the full decode of a batch's files, every unreadable one an error row, never fatal. `jaxcap.processing` is
imported only when called (the listing and output files, `annotation_files`, need none of it).
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from jaxcap.data.annotation_files import ImageItem
from jaxcap.data.records import is_video_file


def media_grid(item: ImageItem, processor) -> tuple[int, int, int]:
  """(t, h, w) in patches of an image or video as processed, from its file header (frames sampled for a video)."""
  from jaxcap.processing import read_image_size, video_file_grid

  if is_video_file(item.path):
    return tuple(int(n) for n in video_file_grid(item.path, processor.video_cfg, record=item.id))
  h, w = read_image_size(item.path, processor.vision_cfg.max_image_pixels, record=item.id)
  return tuple(int(n) for n in processor.vision_cfg.grid(h, w))


def sort_by_size(items: Iterable[ImageItem], processor) -> tuple[list[ImageItem], list[dict]]:
  """Images and videos ordered by their processed size (patches), reading only file headers (EXIF rotation
  applied), so each batch mixes sizes that pad little; returns (items, error rows)."""
  sized, errors = [], []
  for item in items:
    try:
      patches = int(np.prod(media_grid(item, processor)))
    except Exception as e:  # any unreadable file is reported, never fatal
      errors.append({"id": item.id, "image": item.path, "error": f"cannot read: {e}"})
      continue
    sized.append((patches, item))
  return [item for _, item in sorted(sized, key=lambda x: x[0])], errors


def load_images(items: Sequence[ImageItem], processor) -> tuple[list[tuple[ImageItem, dict]], list[dict]]:
  """Fully decodes each image, or samples each video's frames (a truncated file fails here, not inside the batch):
  (item, its conversation content item) pairs and error rows."""
  from jaxcap.processing import load_image, read_video

  ok, errors = [], []
  for item in items:
    try:
      if is_video_file(item.path):
        clip = read_video(item.path, processor.video_cfg, resize=True, record=item.id)
        ok.append((item, {"type": "video", "video": clip}))
      else:
        image = load_image(item.path, processor.vision_cfg.max_image_pixels, record=item.id)
        image.load()
        ok.append((item, {"type": "image", "image": image}))
    except Exception as e:
      errors.append({"id": item.id, "image": item.path, "error": str(e)})
  return ok, errors
