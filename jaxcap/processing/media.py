"""Whether a media file decodes with the decoders training uses (EXIF, alpha, pixel limit, video frame sampling):
the check `jaxcap.data.media_check.check_record_media` runs on every record before training starts."""

from __future__ import annotations

import os

from jaxcap.data.records import is_video_file
from jaxcap.processing.video_frames import read_video
from jaxcap.processing.image_decoding import load_image


def decode_problem(path: str) -> str | None:
  """Why the image or video file at `path` cannot be used (None when it decodes: an image completely, a video file
  at the frames training samples, each resized as it is decoded so memory stays small)."""
  if not os.path.isfile(path):
    return "no such file" if not os.path.exists(path) else "not a regular file"
  try:
    if is_video_file(path):
      read_video(path, resize=True)
    else:
      load_image(path)
  except ValueError as e:  # load_image's own message, or its wrapper around the decoder's error
    return f"{type(e.__cause__).__name__}: {e.__cause__}" if e.__cause__ is not None else str(e)
  except Exception as e:  # noqa: BLE001 -- any other decoder failure (SyntaxError, DecompressionBombError, ...)
    return f"{type(e).__name__}: {e}"
  return None
