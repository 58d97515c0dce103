"""Manifests stay inside their data root: a media path (image, video, frame) that resolves outside it is refused.

A dataset's rows name their files relative to the manifest's folder; a row such as `../../etc/passwd` or
`/home/someone/.ssh/id_rsa` reaches files that are no part of the dataset. Every reader of a manifest (the trainer,
`jaxcap.eval`, `jaxcap.caption`, the inspector, the curation and rubric programs) confines its rows to a root: the
manifest's folder by default (a `save_to_disk` dataset's: the folder holding it; a Hub dataset's: the current
directory), or a folder the user names (`data.media_root`, or the program's media-root flag). Paths are compared
as written, made absolute and normalised (`..` folded), not through symbolic links: a link inside the root that
the dataset's owner placed there is followed as before. Rows whose files lie elsewhere on purpose (released rows
carrying their authors' absolute paths) are read with the allow flag (`data.allow_outside_paths`).
"""

from __future__ import annotations

import os
from typing import NamedTuple


class Flags(NamedTuple):
  """How a program spells its two settings, for the error's fix."""

  root: str  # names the folder media must lie in
  allow: str  # reads media anywhere


TRAIN_FLAGS = Flags("--config.data.media_root=DIR", "--config.data.allow_outside_paths=true")


def root_folder(media_root: str | os.PathLike | None, default: str | os.PathLike) -> str:
  """The absolute, normalised folder media must lie in: `media_root` when set, else `default`."""
  return os.path.normpath(os.path.abspath(media_root or default))


def inside(path: str, root: str) -> bool:
  """Whether `path` (as it will be opened: absolute, or relative to the current directory) lies in the folder
  `root` (absolute, normalised), comparing the normalised paths as written."""
  try:
    return os.path.commonpath([os.path.normpath(os.path.abspath(path)), root]) == root
  except ValueError:  # different drives (Windows)
    return False


def outside_message(where: str, raw: str, path: str, root: str, flags: Flags = TRAIN_FLAGS) -> str:
  """The one-line refusal of a row's media path `raw` (as the row writes it; as it will be opened: `path`) outside
  `root`;
  `where` names the file, row and id."""
  resolved = os.path.normpath(os.path.abspath(path))
  return (
    f"{where}: media path {raw!r} resolves to {resolved}, outside the data root {root}; keep the dataset's files "
    f"under it, set {flags.root} to a folder holding them all, or {flags.allow} to read paths anywhere"
  )
