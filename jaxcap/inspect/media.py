"""Thumbnails of the media the site shows: JPEGs of at most `size` px a side (512: the page shows them at 240 px
and enlarged on a click) under <site>/media/, named by a hash of the source path and size, made once (a rebuild
of the site reuses them). A video file gets its first frame (PyAV); a file that cannot be read gets no thumbnail
(the page shows its path)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from PIL import Image, ImageOps


def resolve(path: str, roots: list[Path]) -> Path | None:
  """`path` as given when absolute, else under the first of `roots` that holds it."""
  if not path:
    return None
  p = Path(path)
  if p.is_absolute():
    return p if p.exists() else None
  return next((r / p for r in roots if (r / p).exists()), None)


def _first_frame(path: Path) -> Image.Image:
  import av

  with av.open(str(path)) as container:
    return next(container.decode(video=0)).to_image()


class Thumbnails:
  """`url(path)` -> the thumbnail's path relative to the site (None when the source cannot be read)."""

  VIDEO = {".mp4", ".webm", ".mkv", ".mov", ".avi"}

  def __init__(self, site: Path, roots: list[Path], size: int = 512):
    self.directory = site / "media"
    self.roots, self.size = roots, size
    self._made: dict[str, str | None] = {}

  def url(self, path: str) -> str | None:
    if path in self._made:
      return self._made[path]
    source, url = resolve(path, self.roots), None
    if source is not None:
      name = hashlib.sha1(f"{source.resolve()}:{self.size}".encode()).hexdigest()[:16] + ".jpg"
      target = self.directory / name
      try:
        if not target.exists():
          image = _first_frame(source) if source.suffix.lower() in self.VIDEO else Image.open(source)
          image = ImageOps.exif_transpose(image).convert("RGB")
          image.thumbnail((self.size, self.size))
          self.directory.mkdir(parents=True, exist_ok=True)
          image.save(target, quality=92)  # small synthetic images are shown enlarged
        url = f"media/{name}"
      except Exception:  # an unreadable file: the page names it instead
        url = None
    self._made[path] = url
    return url
