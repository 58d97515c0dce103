"""Training data: manifest records (`jaxcap.data.manifest`) served by grain, shuffled per epoch and sharded per
process, and their media loaded into chat conversations; optionally each step's batch prepared ahead (images
decoded and processed) on grain's prefetch thread; `Ahead`, the loader with batches drawn ahead (the asynchronous
schedule's)."""

from __future__ import annotations

import collections
import inspect
from typing import Any, Callable, Sequence

import grain
import jax
import numpy as np
from PIL import Image

from jaxcap.data.manifest import ManifestError
from jaxcap.data.records import ImageRecord, is_video_file
from jaxcap.processing.video import VideoClip, VideoPreprocessConfig
from jaxcap.processing.video_frames import read_video
from jaxcap.processing.image_decoding import DEFAULT_MAX_IMAGE_PIXELS, load_image


def record_loader(
  records: Sequence[ImageRecord],
  batch_size: int,
  seed: int,
  process_index: int | None = None,
  process_count: int | None = None,
  prepare: Callable[[list], Any] | None = None,
  prefetch: int = 2,
  sizes: Sequence[int] | None = None,
  group: int = 0,
):
  """An endless, checkpointable iterator over lists of `batch_size` records for this process.

  Every process walks the same shuffled order (reshuffled each epoch from `seed`) in global batches of
  `batch_size * process_count` and takes its contiguous slice, so the global batch of a step is the same
  whatever the number of processes. `get_state()` / `set_state()` save and restore the position.

  With `prepare`, the iterator yields `prepare(records)` instead (`prepare(records, step=i)` for the i-th batch
  when it takes a `step`), computed ahead on one background thread for at most `prefetch` batches (e.g. decoding
  and processing the images of the next steps while the device runs this one); the batches, their order and the
  saved position are the same as without it.

  With `sizes` (e.g. vision patches per record) and `group` > 1, each window of `group` global batches of an
  epoch holds records sorted by size (`jaxcap.train.rollouts.size_groups`): batches of similar sizes pad less.
  """
  process_index = jax.process_index() if process_index is None else process_index
  process_count = jax.process_count() if process_count is None else process_count
  if len(records) < batch_size * process_count:
    raise ManifestError(
      f"{len(records)} records cannot fill one global batch of {batch_size} x "
      f"{process_count} processes; lower the batch size or add data."
    )
  lo, hi = process_index * batch_size, (process_index + 1) * batch_size
  if sizes is not None and group > 1:
    from jaxcap.train.rollouts.size_groups import grouped_records

    pick = grouped_records(list(records), sizes, batch_size * process_count, group, seed)
    ds = grain.MapDataset.range(len(records)).repeat().map_with_index(pick)
  else:
    ds = grain.MapDataset.source(list(records)).shuffle(seed=seed).repeat()
  # the stream is endless, so dropping a remainder drops nothing; it keeps len() an index-sized int (grain rounds an
  # endless length up through a float: a global batch of 1 overflowed)
  ds = ds.batch(batch_size * process_count, batch_fn=list, drop_remainder=True).map(lambda batch: batch[lo:hi])
  if prepare is None:
    return iter(ds.to_iter_dataset())
  # One thread, so `prepare` (the processor, its tokenizer) never runs concurrently with itself; the buffer
  # bounds how far ahead it runs.
  options = grain.ReadOptions(num_threads=1, prefetch_buffer_size=max(1, prefetch))
  if "step" in inspect.signature(prepare).parameters:
    # a batch's index is the phase's step (a resumed loader goes on counting from its saved position)
    return iter(ds.map_with_index(lambda i, batch: prepare(batch, step=i)).to_iter_dataset(options))
  return iter(ds.map(prepare).to_iter_dataset(options))


def load_media(
  record: ImageRecord,
  image_size: int | None,
  video_cfg: VideoPreprocessConfig | None = None,
  max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
) -> Any:
  """The record's media, decoded: an RGB PIL image (EXIF rotation applied, transparency on white), a list of
  frames, or for a video file a `VideoClip` of the frames `video_cfg` samples (default: fps 2, 4..768 frames),
  already resized to the target when `video_cfg` is given (pass the processor's). With `image_size` every image / frame is resized to that square side
  (pixels), so that every item of a step shares one vision layout. Raises ValueError naming the record and the
  file when the file is unreadable, or larger than `max_image_pixels` (with the fix)."""
  if is_video_file(record.image) and not record.frames:
    # resized while decoding (small in memory) only for the processor's own config; else at full size
    clip = read_video(record.image, video_cfg, resize=video_cfg is not None and not image_size, record=record.id)
    if image_size:
      clip.frames = np.stack([np.asarray(_square(Image.fromarray(f), image_size)) for f in clip.frames])
    return clip

  def one(p):
    return _square(load_image(p, max_image_pixels, record=record.id), image_size)

  return [one(p) for p in record.frames] if record.frames else one(record.image)


def _square(image: Image.Image, image_size: int | None):
  return image.resize((image_size, image_size), Image.Resampling.BICUBIC) if image_size else image


def conversation(
  record: ImageRecord,
  prompt: str,
  image_size: int | None,
  fps: float = 2.0,
  video_cfg: VideoPreprocessConfig | None = None,
  max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
) -> list[dict]:
  """One user turn: the record's media (`load_media`) then `prompt`. `fps` is the rate of a record's frame list;
  a video file is sampled by `video_cfg` (pass the processor's, `processor.video_cfg`)."""
  media = load_media(record, image_size, video_cfg, max_image_pixels)
  if isinstance(media, VideoClip):
    item = {"type": "video", "video": media, "record": record.id}
  elif record.frames:
    item = {"type": "video", "video": media, "fps": fps, "record": record.id}
  else:
    item = {"type": "image", "image": media, "record": record.id}
  return [{"role": "user", "content": [item, {"type": "text", "text": prompt}]}]


class Ahead:
  """The phase's loader with batches drawn ahead: `peek(n)` is the n-th batch after those handed out, drawn early,
  and the loop's `next()` hands them out in order. `get_state()` is the position before the first batch drawn
  ahead and not handed out yet; `close()` stops the schedule's rollout thread first."""

  def __init__(self, loader, on_close=lambda: None):
    self.loader = loader
    self._ahead: collections.deque = collections.deque()  # (position before it, batch)
    self._on_close = on_close

  def __iter__(self):
    return self

  def __next__(self):
    return self._ahead.popleft()[1] if self._ahead else next(self.loader)

  def peek(self, n: int = 1):
    while len(self._ahead) < n:
      self._ahead.append((self.loader.get_state(), next(self.loader)))
    return self._ahead[n - 1][1]

  def get_state(self):
    return self._ahead[0][0] if self._ahead else self.loader.get_state()

  def set_state(self, state) -> None:
    self._ahead.clear()
    self.loader.set_state(state)

  def close(self) -> None:
    try:
      self._on_close()
    finally:
      getattr(self.loader, "close", lambda: None)()
