"""Training data: a manifest of image records, read with grain, shuffled per epoch and sharded per process.

A manifest is JSONL (or Parquet, with pyarrow installed): one row per image with `id`, `image` (path, relative
to the manifest's folder or absolute) or `frames` (a clip), `questions`, `rubric`, `reference_caption`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Sequence

import grain
import jax
from PIL import Image

from jaxcap.rewards.record import ImageRecord


class ManifestError(ValueError):
  """A manifest row that cannot be used, naming the file, the line and the fix."""


def read_manifest(path: str | os.PathLike) -> list[ImageRecord]:
  """All rows of a JSONL / Parquet manifest as `ImageRecord`s with absolute media paths.

  A corrupt row raises `ManifestError` naming its line; nothing is partially consumed.
  """
  path = Path(path)
  if not path.exists():
    raise ManifestError(
      f"manifest {path} does not exist; set --config.data.train_manifest to a JSONL file "
      "(one JSON object per line) or leave it empty for the synthetic world."
    )
  if path.suffix == ".parquet":
    try:
      import pyarrow.parquet as pq
    except ImportError as e:
      raise ManifestError(f"{path} is Parquet; `pip install pyarrow` to read it, or convert it to JSONL") from e
    rows = [(i + 1, r) for i, r in enumerate(pq.read_table(path).to_pylist())]
  else:
    rows = []
    with open(path) as f:
      for lineno, line in enumerate(f, 1):
        if not line.strip():
          continue
        try:
          rows.append((lineno, json.loads(line)))
        except json.JSONDecodeError as e:
          raise ManifestError(f"{path}:{lineno} is not valid JSON ({e.msg}); fix or delete that line.") from e
  records = []
  for lineno, row in rows:
    try:
      rec = ImageRecord.from_json(row)
    except (ValueError, KeyError, TypeError) as e:
      raise ManifestError(f"{path}:{lineno}: {e}") from e
    if not rec.image and not rec.frames:
      raise ManifestError(f"{path}:{lineno} (id {rec.id!r}) has neither 'image' nor 'frames'; every row needs media.")
    absolute = lambda p: p if os.path.isabs(p) else str(path.parent / p)
    records.append(
      dataclasses.replace(
        rec, image=absolute(rec.image) if rec.image else "", frames=tuple(absolute(p) for p in rec.frames)
      )
    )
  if not records:
    raise ManifestError(f"manifest {path} has no rows")
  return records


def check_media(records: Sequence[ImageRecord]) -> None:
  """Fails early, naming the first missing image, before any compute is spent."""
  for rec in records:
    for p in rec.frames or (rec.image,):
      if not os.path.exists(p):
        raise ManifestError(
          f"record {rec.id!r}: image file {p} does not exist; fix the manifest's path "
          "(relative paths are resolved against the manifest's folder)."
        )


def record_loader(
  records: Sequence[ImageRecord],
  batch_size: int,
  seed: int,
  process_index: int | None = None,
  process_count: int | None = None,
):
  """An endless, checkpointable iterator over lists of `batch_size` records for this process.

  Every process walks the same shuffled order (reshuffled each epoch from `seed`) in global batches of
  `batch_size * process_count` and takes its contiguous slice, so the global batch of a step is the same
  whatever the number of processes. `get_state()` / `set_state()` save and restore the position.
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
  return iter(ds.to_iter_dataset())


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
