"""The key and array layouts of Hugging Face student checkpoints: jaxcap param path <-> HF tensor name, and each
tensor's transpose / reshape between the two (shared by loading, saving and the PEFT adapter export)."""

from __future__ import annotations

import re

import numpy as np

from jaxcap.models.config import Qwen25VLConfig

# Each rule: jaxcap param path regex -> (HF tensor name template, layout). Layouts:
#   "same": identical array; "t": HF [out, in] <-> kernel [in, out]; "conv": Conv3d [D, C, T, P, P] <-> [CTPP, D].
# Decoder layers and ViT blocks are stacked in jaxcap (leading layer axis); their HF names hold "*" where the
# layer index goes (`layer_names`).
_RULES: list[tuple[str, str, str]] = [
  (r"visual\.patch_embed\.kernel", "visual.patch_embed.proj.weight", "conv"),
  (r"visual\.patch_embed\.bias", "visual.patch_embed.proj.bias", "same"),  # Qwen3-VL
  (r"visual\.pos_embed\.embedding", "visual.pos_embed.weight", "same"),  # Qwen3-VL
  (r"visual\.deepstack_merger_list\.(.*)", r"visual.deepstack_merger_list.*.\1", "lin"),  # Qwen3-VL, stacked
  (r"visual\.merger\.fc1\.(kernel|bias)", r"visual.merger.mlp.0.\1", "lin"),
  (r"visual\.merger\.fc2\.(kernel|bias)", r"visual.merger.mlp.2.\1", "lin"),
  (r"visual\.blocks\.(.*)", r"visual.blocks.*.\1", "lin"),
  (r"visual\.(.*)", r"visual.\1", "lin"),
  (r"embed_tokens\.embedding", "model.embed_tokens.weight", "same"),
  (r"lm_head\.kernel", "lm_head.weight", "t"),
  (r"layers\.(.*)", r"model.layers.*.\1", "lin"),
  # Qwen3.5's two stacks: the "*" of each is its kind's decoder indices (`stack_indices`)
  (r"(?:linear|attention)_layers\.(.*)", r"model.layers.*.\1", "lin"),
  (r"norm\.weight", r"model.norm.weight", "same"),
]


def hf_name(path: str) -> tuple[str, str]:
  """(HF tensor name, layout) of a jaxcap param path such as 'layers.self_attn.q_proj.kernel'; the name of a
  stacked (per-layer) param holds "*" for the layer index: 'model.layers.*.self_attn.q_proj.weight'."""
  for pattern, template, layout in _RULES:
    m = re.fullmatch(pattern, path)
    if m:
      name = m.expand(template)
      if layout == "lin":
        layout = "t" if name.endswith(".kernel") else "same"
        name = re.sub(r"\.kernel$", ".weight", name)
      return name, layout
  raise KeyError(f"no HF name for param {path!r}")


def layer_names(name: str, num_layers: int, indices=None) -> list[str]:
  """The per-layer HF names of a stacked param's name template ('model.layers.*.mlp...'), or [name]; `indices`:
  the HF layer index of each entry of the stack (`stack_indices`; default 0 .. num_layers - 1)."""
  indices = range(num_layers) if indices is None else indices
  return [name.replace("*", str(i)) for i in indices] if "*" in name else [name]


def stack_indices(path: str, cfg) -> tuple[int, ...] | None:
  """The decoder layer index of each entry of the stack holding the param at `path` where the stack is one kind
  of a hybrid decoder (Qwen3.5's `linear_layers` / `attention_layers`), else None (entry i is layer i)."""
  for stack, kind in (("linear_layers.", "linear_attention"), ("attention_layers.", "full_attention")):
    if path.startswith(stack):
      return cfg.text.layer_indices(kind)
  return None


def from_hf_layout(array: np.ndarray, layout: str) -> np.ndarray:
  """An HF tensor (or block of one) in jaxcap's layout."""
  if layout == "t":
    return array.T
  if layout == "conv":
    return array.reshape(array.shape[0], -1).T
  return array


def hf_shape(shape: tuple[int, ...], layout: str, cfg: Qwen25VLConfig) -> tuple[int, ...]:
  """The HF tensor shape of a jaxcap array of `shape` (one layer's, for a stacked param)."""
  if layout == "t":
    return tuple(shape[::-1])
  if layout == "conv":
    v = cfg.vision
    return (v.hidden_size, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size)
  return tuple(shape)


def to_hf_layout(array: np.ndarray, layout: str, hf_shape: tuple[int, ...] | None = None) -> np.ndarray:
  """A jaxcap array in the HF tensor's layout (`hf_shape`: the conv kernel's 5-d shape)."""
  if layout == "t":
    return np.ascontiguousarray(array.T)
  if layout == "conv":
    return np.ascontiguousarray(array.T).reshape(hf_shape)
  return array


def alt_names(name: str) -> list[str]:
  """The same tensor under the older (`visual.`, `model.`) and newer (`model.visual.`, `model.language_model.`)
  key layouts that different transformers versions write."""
  alts = [name]
  if name.startswith("visual."):
    alts.append("model." + name)
  elif name.startswith("model."):
    alts.append("model.language_model." + name[len("model.") :])
  return alts


def path_name(path) -> str:
  """'layers.self_attn.q_proj.kernel' from a pytree key path."""
  return ".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
