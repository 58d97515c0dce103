"""Where a manifest's rows come from besides a JSONL / Parquet file: a folder of images and videos, or a Hugging Face
`datasets` dataset (a `Dataset.save_to_disk` directory, or `hf://<name>[:<split>]` through `datasets.load_dataset`).

Each reader returns a `Source`: the rows numbered from 1 (what errors name), the label errors name, and the folder
relative media paths resolve against. Failures raise ValueError with the fix; `read_manifest` reports them.
"""

from __future__ import annotations

import collections
import json
import os
from pathlib import Path
from typing import Any, NamedTuple

from jaxcap.data.annotation_files import IMAGE_SUFFIXES, VIDEO_SUFFIXES, scan_directory
from jaxcap.data.records import is_video_file

_SAVED_DATASET_FILES = ("state.json", "dataset_info.json", "dataset_dict.json")  # what `save_to_disk` writes


class Source(NamedTuple):
  label: str  # the file, folder or hf:// name errors name
  base: Path  # relative media paths resolve against it
  rows: list[tuple[int, Any]]  # (row number, row)


def hub_spec(path: str | os.PathLike) -> str | None:
  """The `<name>[:<split>]` of an `hf://` source, else None (`Path` folds "hf://x" into "hf:/x": both are read)."""
  text = os.fspath(path)
  return next((text[len(p) :] for p in ("hf://", "hf:/") if text.startswith(p)), None)


def directory_rows(directory: Path) -> Source:
  """A `save_to_disk` dataset's rows, or else one row per image / video file under the folder."""
  if any((directory / name).is_file() for name in _SAVED_DATASET_FILES):
    return saved_dataset_rows(directory)
  return folder_rows(directory)


def folder_rows(directory: Path) -> Source:
  """One row per image / video under `directory` (recursively, sorted; hidden files and folders and other files
  passed over), id its path relative to the folder without the suffix (with it where two files share a stem), the
  media path absolute. The rows have no questions: a reward that needs none can train on them."""
  root = Path(os.path.abspath(directory))
  items = [i for i in scan_directory(root)[0] if not any(p.startswith(".") for p in Path(i.id).parts)]
  if not items:
    suffixes = " ".join(sorted(IMAGE_SUFFIXES | VIDEO_SUFFIXES))
    raise ValueError(f"folder {directory} holds no image or video files (suffixes {suffixes})")
  stems = collections.Counter(os.path.splitext(i.id)[0] for i in items)
  rows = []
  for number, item in enumerate(items, 1):
    stem = os.path.splitext(item.id)[0]
    row_id = stem if stems[stem] == 1 else item.id  # a.jpg and a.png: ids "a.jpg" and "a.png"
    rows.append((number, {"id": row_id, "video" if is_video_file(item.path) else "image": item.path}))
  return Source(str(directory), root, rows)


def saved_dataset_rows(directory: Path) -> Source:
  """The rows of a `Dataset.save_to_disk` directory; relative media paths resolve against the folder holding it
  (as against a manifest file's folder). A `DatasetDict` is refused, naming its splits' folders."""
  datasets = _datasets()
  if (directory / "dataset_dict.json").is_file():
    splits = json.loads((directory / "dataset_dict.json").read_text()).get("splits", [])
    raise ValueError(
      f"{directory} is a DatasetDict (splits {splits}); point the manifest at one split's folder, e.g. "
      f"{directory / (splits[0] if splits else 'train')}"
    )
  try:
    dataset = datasets.Dataset.load_from_disk(str(directory))
  except Exception as e:  # datasets raises several kinds; the message says what it found
    raise ValueError(f"{directory} looks like a `save_to_disk` dataset but does not load: {e}") from e
  return Source(str(directory), Path(os.path.abspath(directory)).parent, table_rows(dataset))


def hub_rows(spec: str) -> Source:
  """`datasets.load_dataset(name, split=split)` of an `hf://<name>[:<split>]` source (split "train" by default).
  A local folder's relative media paths resolve against it, a Hub dataset's against the current directory."""
  name, sep, split = spec.rpartition(":")
  if not sep or "/" in split:
    name, split = spec, "train"
  name = name.removeprefix("datasets/")  # hf://datasets/org/name, as huggingface_hub spells dataset repos
  local = Path(name)
  if local.is_dir() and any((local / n).is_file() for n in _SAVED_DATASET_FILES):
    return saved_dataset_rows(local)
  datasets = _datasets()
  try:
    dataset = datasets.load_dataset(name, split=split)
  except Exception as e:  # not found, offline, unknown split, ...: datasets' message says which
    raise ValueError(
      f"hf://{spec}: datasets.load_dataset({name!r}, split={split!r}) failed ({type(e).__name__}: {e}); without "
      "network, load it once where the Hub is reachable and `save_to_disk` it, then point the manifest at that folder"
    ) from e
  base = Path(os.path.abspath(name)) if local.is_dir() else Path.cwd()
  return Source(f"hf://{spec}", base, table_rows(dataset))


def table_rows(dataset: Any) -> list[tuple[int, Any]]:
  """A `datasets.Dataset`'s rows as stored (images as their {"bytes", "path"} dicts, not decoded), nulls dropped."""
  rows = []
  for batch in dataset.with_format("arrow").iter(batch_size=4096):
    rows.extend(batch.to_pylist())
  return [(number, drop_nulls(row)) for number, row in enumerate(rows, 1)]


def drop_nulls(value: Any) -> Any:
  """A columnar row without its null fields (at any depth): Arrow fills a field a row lacks with null, which means
  absent here."""
  if isinstance(value, dict):
    return {k: drop_nulls(v) for k, v in value.items() if v is not None}
  if isinstance(value, list):
    return [drop_nulls(v) for v in value]
  return value


def _datasets():
  try:
    import datasets
  except ImportError as e:
    raise ValueError(
      "reading a Hugging Face dataset needs the `datasets` package: pip install -e '.[data]' (or pip install datasets)"
    ) from e
  return datasets
