"""Hugging Face checkpoint I/O for the student families (Qwen2.5-VL, Qwen3-VL): local directory <-> Flax params,
placed shard by shard. The family (config class, Flax module) is picked from config.json's `model_type`.

Loading reads each tensor lazily from its safetensors file and hands every device only the slice it owns
(`jax.make_array_from_callback`), converting dtype on the way, so a 7B model never needs a full host copy.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, SingleDeviceSharding
from safetensors import safe_open
from safetensors.numpy import save_file

from jaxcap.checkpoint.precision import checkpoint_dtype
from jaxcap.models.config import Qwen25VLConfig
from jaxcap.models import lora
from jaxcap.models.families import family_of_config, family_of_model_type
from jaxcap.models.qwen25vl import Qwen25VL
from jaxcap.sharding import param_shardings

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


class CheckpointError(ValueError):
  """A local directory that is not a loadable student checkpoint, with what is wrong and how to fix it."""


# --------------------------------------------------------------------------- name mapping
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


def layer_names(name: str, num_layers: int) -> list[str]:
  """The per-layer HF names of a stacked param's name template ('model.layers.*.mlp...'), or [name]."""
  return [name.replace("*", str(i)) for i in range(num_layers)] if "*" in name else [name]


def _from_hf(array: np.ndarray, layout: str) -> np.ndarray:
  if layout == "t":
    return array.T
  if layout == "conv":
    return array.reshape(array.shape[0], -1).T
  return array


def _hf_shape(shape: tuple[int, ...], layout: str, cfg: Qwen25VLConfig) -> tuple[int, ...]:
  if layout == "t":
    return tuple(shape[::-1])
  if layout == "conv":
    v = cfg.vision
    return (v.hidden_size, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size)
  return tuple(shape)


def _to_hf(array: np.ndarray, layout: str, hf_shape: tuple[int, ...] | None = None) -> np.ndarray:
  if layout == "t":
    return np.ascontiguousarray(array.T)
  if layout == "conv":
    return np.ascontiguousarray(array.T).reshape(hf_shape)
  return array


def _alt_names(name: str) -> list[str]:
  """The same tensor under the older (`visual.`, `model.`) and newer (`model.visual.`, `model.language_model.`)
  key layouts that different transformers versions write."""
  alts = [name]
  if name.startswith("visual."):
    alts.append("model." + name)
  elif name.startswith("model."):
    alts.append("model.language_model." + name[len("model.") :])
  return alts


# --------------------------------------------------------------------------- reading
class _TensorIndex:
  """Lazy access to the tensors of a (possibly sharded) safetensors checkpoint."""

  def __init__(self, directory: Path):
    index_file = directory / "model.safetensors.index.json"
    if index_file.exists():
      weight_map = json.loads(index_file.read_text())["weight_map"]
    elif (directory / "model.safetensors").exists():
      with safe_open(directory / "model.safetensors", "numpy") as f:
        weight_map = {k: "model.safetensors" for k in f.keys()}
    else:
      raise CheckpointError(
        f"{directory} has no model.safetensors or model.safetensors.index.json; a Qwen2.5-VL checkpoint "
        "directory saved by transformers (save_pretrained) or downloaded from the hub is expected."
      )
    self.directory, self.weight_map, self._files = directory, weight_map, {}

  def resolve(self, name: str) -> str | None:
    return next((n for n in _alt_names(name) if n in self.weight_map), None)

  def slice(self, name: str):
    file = self.weight_map[name]
    if file not in self._files:
      self._files[file] = safe_open(self.directory / file, "numpy")
    return self._files[file].get_slice(name)


def read_config(directory: str | os.PathLike, **overrides) -> Qwen25VLConfig:
  """The config of a checkpoint directory, as its family's config class (a `Qwen25VLConfig` or a subclass)."""
  directory = Path(directory)
  if not (directory / "config.json").exists():
    raise CheckpointError(
      f"{directory} has no config.json; pass the directory of a Qwen2.5-VL or Qwen3-VL checkpoint "
      "(the folder holding config.json and model*.safetensors)."
    )
  d = json.loads((directory / "config.json").read_text())
  try:
    family = family_of_model_type(d.get("model_type"))
  except ValueError as e:
    raise CheckpointError(f"{directory}/config.json: {e}") from e
  try:
    return family.config_cls.from_hf_dict(d, **overrides)
  except (KeyError, ValueError) as e:
    raise CheckpointError(f"{directory}/config.json is not a valid {family.name} config: {e}") from e


def _path_name(path) -> str:
  return ".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def load_hf_checkpoint(
  directory: str | os.PathLike, *, mesh: Mesh | None = None, dtype=None, param_dtype=None, **config_overrides
) -> Qwen25VL:
  """Builds the family's model (`Qwen25VL`, `Qwen3VL`) from a local HF checkpoint directory.

  Params are stored as `param_dtype` (default: the checkpoint's own, `checkpoint_dtype`; training passes its float32
  masters) and sharded per `jaxcap.sharding` rules over `mesh` (default: the first local device). `dtype` is the
  compute dtype (default: `param_dtype`).
  """
  directory = Path(directory)
  param_dtype = param_dtype or checkpoint_dtype(directory)
  cfg = read_config(directory, dtype=dtype or param_dtype, param_dtype=param_dtype, **config_overrides)
  index = _TensorIndex(directory)
  model_cls = family_of_model_type(json.loads((directory / "config.json").read_text()).get("model_type")).model_cls
  graphdef, abstract = nnx.split(nnx.eval_shape(lambda: model_cls(cfg, rngs=nnx.Rngs(0))))
  pure = nnx.to_pure_dict(abstract)
  single = SingleDeviceSharding(jax.local_devices()[0])
  shardings = param_shardings(pure, mesh) if mesh is not None else jax.tree.map(lambda _: single, pure)
  missing = []

  def load_one(path, leaf, sharding):
    template, layout = hf_name(_path_name(path))
    stacked = "*" in template
    names = layer_names(template, leaf.shape[0] if stacked else 1)
    tensors = []
    for hf in names:
      found = index.resolve(hf)
      if found is None:
        missing.append(hf)
        continue
      tensor = index.slice(found)
      hf_shape, want = tuple(tensor.get_shape()), _hf_shape(leaf.shape[1:] if stacked else leaf.shape, layout, cfg)
      if hf_shape != want:
        raise CheckpointError(
          f"tensor {found!r} in {directory} has shape {hf_shape}, but config.json implies "
          f"{want}; the weights and config.json do not belong together."
        )
      tensors.append(tensor)
    if len(tensors) < len(names):
      return None
    if stacked:
      return _place_stacked(tensors, layout, leaf.shape, param_dtype, sharding)
    return _place(tensors[0], layout, leaf.shape, param_dtype, sharding)

  arrays = jax.tree_util.tree_map_with_path(load_one, pure, shardings)
  if missing:
    raise CheckpointError(
      f"{directory} lacks {len(missing)} tensor(s) the config needs, e.g. {missing[:3]}; "
      "is it a complete checkpoint of its model_type (all shards present)?"
    )
  nnx.replace_by_pure_dict(abstract, arrays)
  return nnx.merge(graphdef, abstract)


def _read(tensor, layout: str, idx: tuple, dtype) -> np.ndarray:
  """The block `idx` (jaxcap layout) of a lazy safetensors slice, read from disk alone. A slice read is a fresh
  buffer of its own, so a block already in `dtype` (a bf16 checkpoint held in bf16) is handed on as read, not
  copied once more."""
  if layout == "conv":  # small; read whole
    return _from_hf(tensor[:], layout)[idx].astype(dtype, copy=False)
  if layout == "t":
    return np.asarray(tensor[idx[1], idx[0]]).T.astype(dtype, copy=False)
  return np.asarray(tensor[idx]).astype(dtype, copy=False)


def _full(idx, ndim: int) -> tuple:
  return tuple(idx) + (slice(None),) * (ndim - len(idx))


def _place(tensor, layout: str, shape, dtype, sharding) -> jax.Array:
  """A device array holding `tensor` (lazy safetensors slice) in jaxcap layout, each shard read separately."""
  return jax.make_array_from_callback(
    tuple(shape), sharding, lambda idx: _read(tensor, layout, _full(idx, len(shape)), dtype)
  )


def _place_stacked(tensors: list, layout: str, shape, dtype, sharding) -> jax.Array:
  """A stacked [L, ...] device array from L per-layer tensors; each device reads only its block of each layer."""

  def read(idx):
    idx = _full(idx, len(shape))
    layers = range(len(tensors))[idx[0]]
    return np.stack([_read(tensors[i], layout, idx[1:], dtype) for i in layers])

  return jax.make_array_from_callback(tuple(shape), sharding, read)


# --------------------------------------------------------------------------- writing
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
    template, layout = hf_name(_path_name(path))
    value = np.asarray(jax.device_get(_gather(leaf)))
    if dtype is not None:
      value = value.astype(dtype)
    stacked = "*" in template
    for hf, v in zip(layer_names(template, value.shape[0] if stacked else 1), value if stacked else [value]):
      tensors[_alt_names(hf)[-1] if nested else hf] = _to_hf(v, layout, _hf_shape(v.shape, layout, cfg))

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


def _gather(x: jax.Array) -> jax.Array:
  """A fully addressable copy of a possibly multi-host array (one tensor at a time)."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(x, tiled=True)
  return x
