"""Shape buckets: the few sizes a variable quantity (prompt length, vision patches, attention segments) is padded
to, so a stream of inputs of many sizes compiles a handful of programs, not one per size.

The ladder has `steps` sizes per octave (1, 1.5 x 2^k for 2; 1, 1.25, 1.5, 1.75 x 2^k for 4): more steps pad less
and compile more programs (benchmarks/mixed_sizes.py measures both on a COCO-like stream). Every size is a multiple
of `multiple`.
"""

from __future__ import annotations

import math

DEFAULT_STEPS = 2  # sizes per octave of the prompt-length and vision-pack ladders (config: data.bucket_steps)


def ladder(n: int, multiple: int = 1, steps: int = 4) -> int:
  """The smallest ladder size >= n: a multiple of `multiple` of the form (1 + j / steps) * 2^k."""
  n, multiple = int(n), max(1, int(multiple))
  units = max(1, -(-n // multiple))
  if units <= steps:
    return units * multiple
  k = int(math.floor(math.log2(units)))
  step = max(1, (1 << k) // steps)  # one rung of the octave [2^k, 2^(k+1))
  return -(-units // step) * step * multiple


def batch_bucket(rows: int) -> int:
  """The compiled batch size for `rows` prompts: the next power of two."""
  return 1 << max(0, int(rows) - 1).bit_length()
