"""Training data: manifest records (`jaxcap.data.manifest`) served by grain, shuffled per epoch and sharded per
process, and their media loaded into chat conversations; optionally each step's batch prepared ahead (images
decoded and processed) on grain's prefetch thread."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import grain
import jax
from PIL import Image

from jaxcap.data.manifest import ManifestError
from jaxcap.data.records import ImageRecord


def record_loader(
  records: Sequence[ImageRecord],
  batch_size: int,
  seed: int,
  process_index: int | None = None,
  process_count: int | None = None,
  prepare: Callable[[list], Any] | None = None,
  prefetch: int = 2,
):
  """An endless, checkpointable iterator over lists of `batch_size` records for this process.

  Every process walks the same shuffled order (reshuffled each epoch from `seed`) in global batches of
  `batch_size * process_count` and takes its contiguous slice, so the global batch of a step is the same
  whatever the number of processes. `get_state()` / `set_state()` save and restore the position.

  With `prepare`, the iterator yields `prepare(records)` instead, computed ahead on one background thread for
  at most `prefetch` batches (e.g. decoding and processing the images of the next steps while the device runs
  this one); the batches, their order and the saved position are the same as without it.
  """
  process_index = jax.process_index() if process_index is None else process_index
  process_count = jax.process_count() if process_count is None else process_count
  if len(records) < batch_size * process_count:
    raise ManifestError(
      f"{len(records)} records cannot fill one global batch of {batch_size} x "
      f"{process_count} processes; lower the batch size or add data."
    )
  lo, hi = process_index * batch_size, (process_index + 1) * batch_size
  ds = grain.MapDataset.source(list(records)).shuffle(seed=seed).repeat()
  ds = ds.batch(batch_size * process_count, batch_fn=list).map(lambda batch: batch[lo:hi])
  if prepare is None:
    return iter(ds.to_iter_dataset())
  # One thread, so `prepare` (the processor, its tokenizer) never runs concurrently with itself; the buffer
  # bounds how far ahead it runs.
  options = grain.ReadOptions(num_threads=1, prefetch_buffer_size=max(1, prefetch))
  return iter(ds.map(prepare).to_iter_dataset(options))


def load_media(record: ImageRecord, image_size: int | None) -> Any:
  """The record's PIL image (or list of frames), resized to `image_size` squared when set, so that every item
  of a step shares one vision layout. Raises ValueError naming the record and file when unreadable."""

  def one(p):
    try:
      with Image.open(p) as f:
        im = f.convert("RGB")
    except (OSError, ValueError) as e:
      raise ValueError(f"record {record.id!r}: cannot read image {p}: {e}") from e
    return im.resize((image_size, image_size), Image.Resampling.BICUBIC) if image_size else im

  return [one(p) for p in record.frames] if record.frames else one(record.image)


def conversation(record: ImageRecord, prompt: str, image_size: int | None, fps: float = 2.0) -> list[dict]:
  media = load_media(record, image_size)
  item = {"type": "video", "video": media, "fps": fps} if record.frames else {"type": "image", "image": media}
  return [{"role": "user", "content": [item, {"type": "text", "text": prompt}]}]
