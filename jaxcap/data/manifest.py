"""The one manifest reader: a dataset's rows as `ImageRecord`s, plus the ground-truth scenes of synthetic rows.

A manifest is JSONL (or Parquet, with pyarrow installed): one row per image with `id`, `image` (path, relative
to the manifest's folder or absolute, inside the data root: `jaxcap.data.media_root`) or `frames` (a clip), `questions`, `rubric`, `reference_caption`,
`reference_units`, `teacher_captions`, and for the synthetic world its `scene` graph (the rule-based judge's
ground truth). Rows may also be the released CapRL / CapRL++ verl rows (`jaxcap.data.row_formats`), and the
manifest a folder of images and videos or a Hugging Face dataset (`jaxcap.data.sources`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any, NamedTuple, Sequence

from jaxcap.data import sources
from jaxcap.data.media_root import TRAIN_FLAGS, Flags, inside, outside_message, root_folder
from jaxcap.data.records import ImageRecord
from jaxcap.data.row_formats import as_jaxcap_row


_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


class ManifestError(ValueError):
  """A manifest row that cannot be used, naming the file, the line and the fix."""


class Manifest(NamedTuple):
  """records: one per row, media paths absolute; scenes: row id -> its `scene` graph (a JSON object, as the row
  holds it) for rows with one; `jaxcap.world.as_scenes` turns them into the world's `Scene`s."""

  records: list[ImageRecord]
  scenes: dict[str, dict[str, Any]]


def read_manifest(
  path: str | os.PathLike,
  *,
  require_media: bool = True,
  media_root: str | os.PathLike | None = None,
  allow_outside_paths: bool = False,
  flags: Flags = TRAIN_FLAGS,
) -> Manifest:
  """All rows of a manifest: a JSONL / Parquet file, a folder of images and videos, a `Dataset.save_to_disk`
  folder or `hf://<name>[:<split>]` (`jaxcap.data.sources`), its rows jaxcap's or verl's (`jaxcap.data.row_formats`);
  `require_media=False` accepts rows without image or frames (caption-only evaluation). A corrupt row raises
  `ManifestError` naming its line; nothing is partially read.

  Media paths must lie in the data root (`jaxcap.data.media_root`): `media_root`, else the folder relative paths
  resolve against (the manifest's); a row outside it is refused naming the row, the path and the fix (`flags`: how
  the calling program spells its settings) unless `allow_outside_paths`."""
  label, base, rows = _source(path)
  root = root_folder(media_root, base)
  records, scenes, seen = [], {}, {}
  absolute = lambda p: p if os.path.isabs(p) else str(base / p)
  for lineno, row in rows:
    try:
      row = as_jaxcap_row(row, lineno)
      rec = ImageRecord.from_json(row)
      scene = row.get("scene") or None
      if scene is not None and not (isinstance(scene, dict) and isinstance(scene.get("objects"), list)):
        raise ValueError(f"'scene' must be a scene graph object with an 'objects' list, not {type(scene).__name__}")
    except (ValueError, KeyError, TypeError) as e:
      raise ManifestError(f"{label}:{lineno}: {e}") from e
    if require_media and not rec.image and not rec.frames:
      raise ManifestError(
        f"{label}:{lineno} (id {rec.id!r}) has no media; every row needs 'image', 'video' or 'frames' (a verl row: "
        "'images' or 'videos')."
      )
    url = next((p for p in (rec.image, *rec.frames) if _URL.match(p)), None)
    if url is not None:  # read as a local path it would fail later as "does not exist", naming no cause
      raise ManifestError(
        f"{label}:{lineno} (id {rec.id!r}): {url!r} is a URL; media are read from local files only: download them "
        "and give their paths (relative to the manifest's folder, or absolute)"
      )
    outside = next((p for p in (rec.image, *rec.frames) if p and not inside(absolute(p), root)), None)
    if outside is not None and not allow_outside_paths:  # `../../etc/passwd` was opened (and failed to decode)
      raise ManifestError(outside_message(f"{label}:{lineno} (id {rec.id!r})", outside, absolute(outside), root, flags))
    if rec.id in seen:  # rewards key questions, rubrics and scenes by id: a second row would judge against the first's
      raise ManifestError(
        f"{label}:{lineno}: id {rec.id!r} is also the id of row {seen[rec.id]}; give every row its own id."
      )
    seen[rec.id] = lineno
    records.append(
      dataclasses.replace(
        rec, image=absolute(rec.image) if rec.image else "", frames=tuple(absolute(p) for p in rec.frames)
      )
    )
    if scene is not None:
      scenes[rec.id] = scene
  if not records:
    raise ManifestError(f"manifest {label} has no rows")
  return Manifest(records, scenes)


def _source(path: str | os.PathLike) -> sources.Source:
  """The manifest's rows, the label its errors name and the folder its relative media paths resolve against."""
  spec = sources.hub_spec(path)
  path = Path(path)
  if spec is None and not path.exists():
    raise ManifestError(
      f"manifest {path} does not exist; set --config.data.train_manifest to a JSONL / Parquet file, a folder of "
      "images, a `save_to_disk` dataset folder or hf://<dataset>[:<split>], or leave it empty for the synthetic world."
    )
  try:
    if spec is not None:
      return sources.hub_rows(spec)
    if path.is_dir():
      return sources.directory_rows(path)
  except ValueError as e:
    raise ManifestError(str(e)) from e
  return sources.Source(str(path), path.parent, _rows(path))


def _rows(path: Path) -> list[tuple[int, Any]]:
  """(line number, row) pairs; Parquet rows are numbered from 1."""
  if path.suffix == ".parquet":
    try:
      import pyarrow.parquet as pq
    except ImportError as e:
      raise ManifestError(f"{path} is Parquet; `pip install pyarrow` to read it, or convert it to JSONL") from e
    return [(i + 1, sources.drop_nulls(r)) for i, r in enumerate(pq.read_table(path).to_pylist())]
  rows = []
  with open(path, "rb") as f:  # decoded line by line, so an error names the line
    for lineno, raw in enumerate(f, 1):
      try:
        line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")  # a leading byte-order mark is not data
      except UnicodeDecodeError as e:
        raise ManifestError(
          f"{path}:{lineno} is not UTF-8 (byte {raw[e.start]:#04x} at column {e.start + 1}); re-encode the file "
          "as UTF-8 (e.g. `iconv -f latin1 -t utf-8`) or fix that line."
        ) from None
      if not line.strip():
        continue
      try:
        rows.append((lineno, json.loads(line)))
      except json.JSONDecodeError as e:
        raise ManifestError(f"{path}:{lineno} is not valid JSON ({e.msg}); fix or delete that line.") from e
  return rows


def check_media(records: Sequence[ImageRecord]) -> None:
  """Fails early, naming the first missing image, before any compute is spent."""
  for rec in records:
    for p in rec.frames or (rec.image,):
      if not os.path.exists(p):
        raise ManifestError(
          f"record {rec.id!r}: image file {p} does not exist; fix the manifest's path "
          "(relative paths are resolved against the manifest's folder)."
        )
