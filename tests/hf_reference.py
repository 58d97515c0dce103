"""Helpers that build tiny `transformers` Qwen2.5-VL models offline and run them as the reference.

One copy serves the tests and the benchmarks: `benchmarks/fixtures.py` (benchmarks never import tests/)."""

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:  # the repository root, for `benchmarks` (pytest run as a script, worker processes)
  sys.path.append(_ROOT)

from benchmarks.fixtures import (  # noqa: E402
  WORDS,
  hf_inputs,
  hf_model,
  image_conversations,
  paired_models,
  save_tiny_checkpoint,
)

__all__ = ["WORDS", "hf_inputs", "hf_model", "image_conversations", "paired_models", "save_tiny_checkpoint"]
