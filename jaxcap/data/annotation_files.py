"""The annotator's files: the images a folder / manifest / list holds (and the paths it skips, said aloud), the
output shards, the ids already captioned, and appends that survive a kill and name a full disk."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import pathlib
import shutil
import stat
import sys
from typing import Sequence

from jaxcap.data.media_root import Flags, inside, outside_message, root_folder


IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff"}
VIDEO_SUFFIXES = {".mp4", ".webm", ".mkv", ".mov", ".avi"}


@dataclasses.dataclass(frozen=True)
class ImageItem:
  id: str
  path: str


def scan_directory(source: pathlib.Path) -> tuple[list[ImageItem], list[tuple[str, str]]]:
  """The images and videos under a directory (recursively; symbolic links to files followed, to directories not)
  and (path, why) of every other path passed over: a directory or a broken / looping link with a media suffix, a
  link to a directory, a file without a media suffix."""
  items, skipped = [], []
  media = IMAGE_SUFFIXES | VIDEO_SUFFIXES
  for p in sorted(source.rglob("*")):
    rel = p.relative_to(source).as_posix()
    try:
      st = p.stat()  # follows links: a loop raises ELOOP, a dangling link FileNotFoundError
    except OSError as e:
      if not p.is_symlink():
        why = f"cannot be read ({e.strerror})"
      elif e.errno == errno.ELOOP:
        why = "a symbolic link loop"
      else:
        why = f"a symbolic link to a missing file ({os.readlink(p)})"
      skipped.append((str(p), why))
      continue
    if stat.S_ISDIR(st.st_mode):
      if p.is_symlink():
        skipped.append((str(p), "a symbolic link to a directory (not followed)"))
      elif p.suffix.lower() in media:
        skipped.append((str(p), f"a directory named like a {p.suffix} file"))
    elif not stat.S_ISREG(st.st_mode):
      skipped.append((str(p), "not a regular file"))
    elif p.suffix.lower() in media:
      items.append(ImageItem(rel, str(p)))
    else:
      skipped.append((str(p), "not an image or video suffix"))
  return items, skipped


def log_skipped(skipped: Sequence[tuple[str, str]], out=None) -> None:
  """One stderr line per path passed over (those without a media suffix: one line with their count and a few)."""
  out = out or sys.stderr
  plain = [p for p, why in skipped if why == "not an image or video suffix"]
  for path, why in skipped:
    if why != "not an image or video suffix":
      print(f"jaxcap.caption: skipped {path}: {why}", file=out)
  if plain:
    shown = ", ".join(plain[:3]) + (", ..." if len(plain) > 3 else "")
    print(f"jaxcap.caption: skipped {len(plain)} files without an image or video suffix: {shown}", file=out)


class ImageListError(ValueError):
  """A --images source that cannot be used (a bad manifest line, a repeated id, a path outside the data root)."""


CAPTION_FLAGS = Flags("--media_root=DIR", "--allow_outside_paths")  # how jaxcap.caption spells them


def list_images(
  source: str | os.PathLike,
  log=log_skipped,
  *,
  media_root: str | os.PathLike | None = None,
  allow_outside_paths: bool = False,
) -> list[ImageItem]:
  """Every image of a directory / .jsonl manifest / .txt list, sorted by id; duplicate ids are an error. Paths of
  a directory that are not taken go to `log` (scan_directory's (path, why) pairs). A manifest's paths must lie in
  its data root (`jaxcap.data.media_root`: `media_root`, else the manifest's folder) unless `allow_outside_paths`;
  a .txt list names its files as given."""
  source = pathlib.Path(source)
  if source.is_dir():
    items, skipped = scan_directory(source)
    if skipped:
      log(skipped)
  elif source.suffix == ".jsonl":
    items = []
    root = root_folder(media_root, source.parent)
    for n, line in enumerate(source.read_text().splitlines(), 1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
        path = pathlib.Path(row.get("image") or row.get("video") or row["path"])
        items.append(ImageItem(str(row.get("id", path.as_posix())), str(source.parent / path)))
      except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        raise ImageListError(
          f"{source}:{n}: expected a JSON object with 'image' (or 'video' / 'path') and optionally 'id' ({e!r})"
        ) from None
      if not allow_outside_paths and not inside(items[-1].path, root):
        where = f"{source}:{n} (id {items[-1].id!r})"
        raise ImageListError(outside_message(where, str(path), items[-1].path, root, CAPTION_FLAGS))
  elif source.is_file():
    items = [ImageItem(line.strip(), line.strip()) for line in source.read_text().splitlines() if line.strip()]
  else:
    raise FileNotFoundError(
      f"--images {source} does not exist; pass a folder of images, a .jsonl manifest or a .txt list of paths"
    )
  items.sort(key=lambda it: it.id)
  for a, b in zip(items, items[1:]):
    if a.id == b.id:
      raise ImageListError(f"image id {a.id!r} appears twice in {source}; ids must be unique")
  return items


def shard_paths(
  out: str | os.PathLike, errors: str | os.PathLike | None, index: int, count: int
) -> tuple[pathlib.Path, pathlib.Path]:
  """This process's captions and errors files."""
  out = pathlib.Path(out)
  if count > 1:
    out = out.with_name(f"{out.stem}-{index:05d}-of-{count:05d}{out.suffix}")
  return out, pathlib.Path(errors) if errors else out.with_name(f"{out.stem}.errors.jsonl")


def finished_ids(path: pathlib.Path) -> set[str]:
  """Ids already written to a JSONL file; a torn final line (no newline: the writer was killed) is cut off."""
  if not path.exists():
    return set()
  data = path.read_bytes()
  if data and not data.endswith(b"\n"):
    keep = data.rfind(b"\n") + 1
    with open(path, "r+b") as f:
      f.truncate(keep)
    data = data[:keep]
  ids = set()
  for n, line in enumerate(data.decode().splitlines(), 1):
    if line.strip():
      try:
        ids.add(json.loads(line)["id"])
      except (json.JSONDecodeError, KeyError) as e:
        raise ValueError(f"{path}:{n} is not a jaxcap.caption line ({e!r}); move the file away or fix the line")
  return ids


class DiskFullError(OSError):
  """No space left for a write of `needed` bytes to `path` (`free` bytes left on its filesystem)."""

  def __init__(self, path: pathlib.Path, needed: int, free: int | None):
    self.path, self.needed, self.free = path, needed, free
    left = f", {free} bytes free" if free is not None else ""
    super().__init__(
      errno.ENOSPC,
      f"no space left on the device writing {path}: {needed} bytes needed for this batch{left}. Free some space "
      "and rerun the same command: the lines written are kept and the run resumes after them",
    )

  def __str__(self) -> str:
    return self.strerror


def append_lines(path: pathlib.Path, rows: Sequence[dict]) -> None:
  """Appends rows in one write and syncs, so a kill leaves at most one torn final line; a full disk is a
  DiskFullError naming the file and the bytes it needed."""
  if rows:
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    try:
      with open(path, "a") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    except OSError as e:
      if e.errno not in (errno.ENOSPC, errno.EDQUOT):
        raise
      try:
        free = shutil.disk_usage(path.parent).free
      except OSError:
        free = None
      raise DiskFullError(path, len(data.encode()), free) from None
