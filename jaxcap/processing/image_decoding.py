"""Image loading as transformers does it (Pillow + numpy): a file, PIL image or uint8 array -> an RGB PIL image, with
a pixel limit checked from the header before anything is decoded.

A file gets its EXIF orientation applied (`image_utils.load_image`), and transparency (RGBA / LA / PA, or a
palette / RGB image with a `transparency` entry) is composited on white (`image_transforms.convert_to_rgb`);
grayscale, CMYK, palette and 16-bit images go through Pillow's `convert("RGB")`, as there (16-bit values above 255
saturate, they are not rescaled). One deliberate difference: transformers' `load_image` of a *path* converts
straight to RGB, dropping alpha; here a file with transparency is composited on white like an image passed to the
image processor (and like qwen-vl-utils).
"""

from __future__ import annotations

import os

import numpy as np
from PIL import Image, ImageOps

# Pillow's own default `Image.MAX_IMAGE_PIXELS` (1024**3 // 4 // 3, ~9459 x 9459): decoding more costs GBs.
DEFAULT_MAX_IMAGE_PIXELS = 89_478_485


def _too_large(path, detail: str, record: str | None) -> ValueError:
  who = f"record {record!r}: " if record is not None else ""
  return ValueError(
    f"{who}image {os.fspath(path)} is too large to decode ({detail}); downscale the file (e.g. "
    "`convert IN -resize 8192x8192\\> OUT`), drop it from the data, or raise the limit "
    "(VisionPreprocessConfig.max_image_pixels; above twice Pillow's default also PIL.Image.MAX_IMAGE_PIXELS)."
  )


def _open(path, max_image_pixels: int | None, record: str | None) -> Image.Image:
  """Opens (header only) a file, enforcing the pixel limit before anything is decoded."""
  try:
    image = Image.open(path)
  except Image.DecompressionBombError as e:  # Pillow's own guard, at twice its MAX_IMAGE_PIXELS
    raise _too_large(path, f"Pillow's decompression-bomb guard: {e}".rstrip("."), record) from None
  except (OSError, ValueError, SyntaxError) as e:
    who = f"record {record!r}: " if record is not None else ""
    raise ValueError(f"{who}cannot read image {os.fspath(path)!r}: {e}") from e
  if max_image_pixels is not None and image.width * image.height > max_image_pixels:
    image.close()
    detail = f"{image.width}x{image.height} = {image.width * image.height:,} pixels, above {max_image_pixels:,}"
    raise _too_large(path, detail, record)
  return image


def read_image_size(
  path: str | os.PathLike, max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS, record: str | None = None
) -> tuple[int, int]:
  """(height, width) of an image file as `load_image` returns it (EXIF rotation applied), from the header only."""
  with _open(path, max_image_pixels, record) as image:
    width, height = image.size
    orientation = image.getexif().get(0x0112, 1)  # ExifTags.Base.Orientation
  return (width, height) if orientation in (5, 6, 7, 8) else (height, width)


def convert_to_rgb(image: Image.Image) -> Image.Image:
  """RGB, transparency composited on white (transformers' `image_transforms.convert_to_rgb`)."""
  if "A" in image.getbands() or image.info.get("transparency") is not None:
    image = image.convert("RGBA")
    background = Image.new("RGBA", image.size, (255, 255, 255, 255))
    return Image.alpha_composite(background, image).convert("RGB")
  return image if image.mode == "RGB" else image.convert("RGB")


def array_to_rgb(array: np.ndarray) -> np.ndarray:
  """uint8 [H, W], [H, W, 1|3|4] -> uint8 [H, W, 3], alpha composited on white as transformers does for arrays."""
  if array.dtype != np.uint8:
    raise ValueError(f"image array of dtype {array.dtype}; pass uint8 [H, W, 3] (0..255), or a PIL image.")
  if array.ndim == 2:
    array = array[..., None]
  if array.ndim != 3 or array.shape[-1] not in (1, 3, 4):
    raise ValueError(f"image array of shape {array.shape}; pass uint8 [H, W, 3] (channels last).")
  if array.shape[-1] == 1:
    return np.repeat(array, 3, axis=-1)
  if array.shape[-1] == 4:
    alpha = array[..., 3:4] / 255
    return np.round(alpha * array[..., :3] + (1 - alpha) * 255).astype(np.uint8)
  return array


def load_image(
  source: str | os.PathLike | Image.Image | np.ndarray,
  max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
  record: str | None = None,
) -> Image.Image:
  """An RGB PIL image, fully decoded, from a path (EXIF orientation applied), a PIL image or a uint8 array.

  A file that cannot be read, or larger than `max_image_pixels`, raises ValueError naming it (and `record`)."""
  if isinstance(source, Image.Image):
    return convert_to_rgb(source)
  if isinstance(source, np.ndarray):
    return Image.fromarray(array_to_rgb(source))
  if not isinstance(source, (str, os.PathLike)):
    raise ValueError(f"cannot load an image from a {type(source).__name__}; pass a path, a PIL image or an array.")
  image = _open(source, max_image_pixels, record)
  try:
    with image:
      image = convert_to_rgb(ImageOps.exif_transpose(image))
      image.load()
  except (OSError, ValueError, SyntaxError) as e:
    who = f"record {record!r}: " if record is not None else ""
    raise ValueError(f"{who}cannot read image {os.fspath(source)!r}: {e}") from e
  return image
