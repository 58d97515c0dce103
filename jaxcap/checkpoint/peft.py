"""LoRA adapters alone in PEFT's layout (`adapter_config.json` + `adapter_model.safetensors`), which `peft`'s
`PeftModel.from_pretrained(base, directory)` and vLLM's LoRA loader read on top of the base checkpoint.

Each adapted jaxcap module (`jaxcap.models.lora`) becomes the PEFT keys of the transformers module it maps to
(`hf_layout.hf_name`, in the nested `model.language_model.` / `model.visual.` layout that transformers' modules have):
`base_model.model.<module>.lora_A.weight` = A^T [r, in] and `.lora_B.weight` = B^T [out, r], one pair per layer of a
stack; PEFT scales B A by lora_alpha / r, as jaxcap does. A QLoRA run's adapters were trained against the quantized
base: on the full-precision base they compute slightly different outputs (the merged export does not have this gap).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax
import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from jaxcap.checkpoint.hf_layout import alt_names, hf_name, layer_names, stack_indices
from jaxcap.checkpoint.hf_save import gather
from jaxcap.models.layers import Linear


def save_peft_adapters(model: nnx.Module, directory: str | os.PathLike, *, base_model: str = "") -> Path:
  """Writes the LoRA adapters of `model` to `directory` in PEFT's layout; `base_model`: the base checkpoint's
  path or name, recorded as `base_model_name_or_path`."""
  directory = Path(directory)
  tensors: dict[str, np.ndarray] = {}
  modules, rank, alpha = set(), None, None
  for path, lin in nnx.iter_modules(model):
    if not isinstance(lin, Linear) or not hasattr(lin, "kernel_lora_a"):
      continue
    param_path = ".".join(str(p) for p in path) + ".kernel"
    template, _ = hf_name(param_path)
    template = alt_names(template)[-1].removesuffix(".weight")
    a = np.asarray(jax.device_get(gather(lin.kernel_lora_a[...])), np.float32)
    b = np.asarray(jax.device_get(gather(lin.kernel_lora_b[...])), np.float32)
    stacked = a.ndim == 3
    names = layer_names(template, a.shape[0] if stacked else 1, stack_indices(param_path, model.cfg))
    for i, module in enumerate(names):
      ai, bi = (a[i], b[i]) if stacked else (a, b)
      tensors[f"base_model.model.{module}.lora_A.weight"] = np.ascontiguousarray(ai.T)
      tensors[f"base_model.model.{module}.lora_B.weight"] = np.ascontiguousarray(bi.T)
    modules.update(names)
    rank = a.shape[-1]
    alpha = lin.lora_scale * rank
  if not tensors:
    raise ValueError("save_peft_adapters: the model has no LoRA adapters (model.lora.rank=0?)")
  if jax.process_index() == 0:
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, directory / "adapter_model.safetensors", metadata={"format": "pt"})
    config = {
      "peft_type": "LORA",
      "base_model_name_or_path": str(base_model),
      "r": int(rank),
      "lora_alpha": float(alpha),
      "lora_dropout": 0.0,
      "bias": "none",
      "fan_in_fan_out": False,
      "init_lora_weights": True,
      "inference_mode": True,
      # the full names of the adapted modules: a bare name ("gate_proj") would also match the vision tower's MLPs
      # in PEFT, which would attach fresh adapters there
      "target_modules": sorted(modules),
      "task_type": None,
    }
    (directory / "adapter_config.json").write_text(json.dumps(config, indent=2))
  return directory
