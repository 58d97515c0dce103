"""VQA examples in the SFT mix (`sft.vqa_fraction`): which of a step's records are multiple-choice questions
answered with the image instead of captions, and which of their questions.

The draw is a function of (seed, step, record id) alone, so a resumed run replays it and it does not depend on
where a record sits in the batch or on which process holds it. Records without questions always get captions.
The prompt / target format is `jaxcap.processing.vqa`'s, the one the VQA probe scores.
"""

from __future__ import annotations

import zlib
from typing import Sequence

import numpy as np

from jaxcap.data.records import ImageRecord, MultipleChoiceQuestion

_SALT = 0x5641  # "VA": keeps these draws apart from the other per-step generators seeded by (seed, ..., step)


def vqa_questions(
  records: Sequence[ImageRecord], *, fraction: float, seed: int, step: int
) -> list[MultipleChoiceQuestion | None]:
  """Per record, the question it is asked at this step, or None (a caption example). Each record with questions
  is a VQA example with probability `fraction`, its question uniform over the record's."""
  if not 0 <= fraction < 1:
    raise ValueError(f"vqa_fraction={fraction}: must be in [0, 1).")
  out: list[MultipleChoiceQuestion | None] = []
  for r in records:
    q = None
    if fraction > 0 and r.questions:
      rng = np.random.default_rng([int(seed), _SALT, int(step), zlib.crc32(r.id.encode())])
      if rng.random() < fraction:
        q = r.questions[int(rng.integers(len(r.questions)))]
    out.append(q)
  return out
