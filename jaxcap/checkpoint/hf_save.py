"""Writing a student as a Hugging Face checkpoint directory that `transformers` loads with `from_pretrained`."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import jax
import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from jaxcap.checkpoint.hf_layout import (
  alt_names,
  hf_name,
  hf_shape,
  layer_names,
  path_name,
  stack_indices,
  to_hf_layout,
)
from jaxcap.models import lora
from jaxcap.models.families import family_of_config
from jaxcap.models.qwen25vl import Qwen25VL

TOKENIZER_FILES = (
  "tokenizer.json",
  "tokenizer_config.json",
  "vocab.json",
  "merges.txt",
  "special_tokens_map.json",
  "added_tokens.json",
  "chat_template.json",
  "chat_template.jinja",
  "preprocessor_config.json",
  "video_preprocessor_config.json",
  "processor_config.json",
  "generation_config.json",
)


def save_hf_checkpoint(
  model: Qwen25VL,
  directory: str | os.PathLike,
  *,
  tokenizer_dir: str | os.PathLike | None = None,
  dtype=None,
  max_shard_bytes: int = 2 * 1024**3,
) -> Path:
  """Writes `model` as an HF checkpoint of its family that `transformers` loads with `from_pretrained(directory)`.

  A model with LoRA adapters (`jaxcap.models.lora`) is written merged: each adapted kernel W + (alpha / r) A B (a
  QLoRA kernel dequantized first), the checkpoint of the plain model. Tensors are written in `dtype` (default: the
  params' dtype) to safetensors shards of at most
  `max_shard_bytes`, with `model.safetensors.index.json` when there is more than one; tokenizer and
  processor files are copied from `tokenizer_dir` when given.
  """
  directory = Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  cfg = model.cfg
  nested = family_of_config(cfg).nested_keys  # the key layout its transformers class reads
  _, state = nnx.split(model, nnx.Param)
  # LoRA adapters folded into their (dequantized) kernels: the plain model's tensors
  pure = lora.merged_pure(model) if lora.has_adapters(state) else nnx.to_pure_dict(state)
  tensors: dict[str, np.ndarray] = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(pure)[0]:
    template, layout = hf_name(path_name(path))
    value = np.asarray(jax.device_get(gather(leaf)))
    if dtype is not None:
      value = value.astype(dtype)
    stacked = "*" in template
    names = layer_names(template, value.shape[0] if stacked else 1, stack_indices(path_name(path), cfg))
    for hf, v in zip(names, value if stacked else [value]):
      tensors[alt_names(hf)[-1] if nested else hf] = to_hf_layout(v, layout, hf_shape(v.shape, layout, cfg))

  shards, current, size = [], {}, 0
  for name in sorted(tensors):
    nbytes = tensors[name].nbytes
    if current and size + nbytes > max_shard_bytes:
      shards.append(current)
      current, size = {}, 0
    current[name] = tensors[name]
    size += nbytes
  shards.append(current)
  if jax.process_index() == 0:
    if len(shards) == 1:
      save_file(shards[0], directory / "model.safetensors", metadata={"format": "pt"})
    else:
      weight_map = {}
      for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, directory / fname, metadata={"format": "pt"})
        weight_map.update({k: fname for k in shard})
      total = sum(t.nbytes for t in tensors.values())
      (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
      )
    hf_cfg = cfg.to_hf_dict()
    first = next(iter(tensors.values()))
    hf_cfg["dtype"] = hf_cfg["text_config"]["dtype"] = hf_cfg["vision_config"]["dtype"] = first.dtype.name
    (directory / "config.json").write_text(json.dumps(hf_cfg, indent=2))
    if tokenizer_dir is not None:
      for fname in TOKENIZER_FILES:
        src = Path(tokenizer_dir) / fname
        if src.exists() and src.resolve() != (directory / fname).resolve():
          shutil.copy(src, directory / fname)
  return directory


def gather(x: jax.Array) -> jax.Array:
  """A fully addressable copy of a possibly multi-host array (one tensor at a time)."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(x, tiled=True)
  return x
