"""The dtype an inference path holds a checkpoint's weights in: the checkpoint's own, unless told otherwise.

Released Qwen2.5-VL checkpoints are stored in bfloat16; holding them as float32 doubles their memory for no gain at
inference. Training keeps its float32 masters (`model.param_dtype`) and does not ask here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax.numpy as jnp

from jaxcap.models.config import dtype_from_name

CHOICES = ("checkpoint", "float32", "bfloat16")  # --dtype / param_dtype spellings; "checkpoint": its config.json's
# stored dtypes jaxcap holds as they are; float16 (and an unstated dtype) is held in float32, which keeps it exactly
_HELD = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float32"}


def stored_dtype(directory: str | os.PathLike) -> str | None:
  """The dtype config.json says the weights are stored in ("dtype", or the older "torch_dtype"; the top level wins
  over text_config, as transformers writes only the top level on a cast), or None when it says nothing."""
  path = Path(directory) / "config.json"
  try:
    d = json.loads(path.read_text())
  except (OSError, ValueError):
    return None
  for block in (d, d.get("text_config") or {}):
    for key in ("dtype", "torch_dtype"):
      if isinstance(block.get(key), str):
        return block[key].removeprefix("torch.")
  return None


def checkpoint_dtype(directory: str | os.PathLike, override: str | None = None):
  """The param dtype (jnp scalar type) to hold `directory`'s weights in for inference: `override` ("float32" /
  "bfloat16") when given, else the checkpoint's stored dtype (float16 or unstated: float32)."""
  if override not in (None, "", "checkpoint"):
    if override not in CHOICES:
      raise ValueError(f"dtype {override!r}: use one of {', '.join(CHOICES)}")
    return dtype_from_name(override)
  stored = stored_dtype(directory)
  return dtype_from_name(_HELD.get(stored, "float32")) if stored else jnp.float32
