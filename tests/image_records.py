"""Random PNG images on disk as `ImageRecord`s: the inputs of tests that run records through the processor."""

from pathlib import Path

import numpy as np
from PIL import Image

from jaxcap.data.records import ImageRecord


def random_image_records(directory: Path, count: int, size: tuple[int, int] = (40, 60)) -> list[ImageRecord]:
  """`count` images of `size` (height, width) pixels, image i drawn from seed i, saved as `directory`/i.png."""
  records = []
  for i in range(count):
    path = Path(directory) / f"{i}.png"
    Image.fromarray((np.random.RandomState(i).rand(*size, 3) * 255).astype(np.uint8)).save(path)
    records.append(ImageRecord(id=str(i), image=str(path)))
  return records
