"""Loading a student from a local Hugging Face checkpoint directory (Qwen2.5-VL, Qwen3-VL), placed shard by shard.
The family (config class, Flax module) is picked from config.json's `model_type`.

Each tensor is read lazily from its safetensors file and every device gets only the slice it owns
(`jax.make_array_from_callback`), converting dtype on the way, so a 7B model never needs a full host copy.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax
from flax import nnx
from jax.sharding import Mesh, SingleDeviceSharding
from safetensors import safe_open

from jaxcap.checkpoint.hf_layout import alt_names, hf_name, hf_shape, layer_names, path_name, stack_indices
from jaxcap.checkpoint.precision import checkpoint_dtype
from jaxcap.checkpoint.tensor_read import LayerReader, layer_axis_whole, place, place_stacked
from jaxcap.models.config import Qwen25VLConfig
from jaxcap.models.families import family_of_model_type
from jaxcap.models.qwen25vl import Qwen25VL
from jaxcap.sharding import param_shardings


class CheckpointError(ValueError):
  """A local directory that is not a loadable student checkpoint, with what is wrong and how to fix it."""


class _TensorIndex:
  """Lazy access to the tensors of a (possibly sharded) safetensors checkpoint."""

  def __init__(self, directory: Path):
    index_file = directory / "model.safetensors.index.json"
    if index_file.exists():
      weight_map = json.loads(index_file.read_text())["weight_map"]
    elif (directory / "model.safetensors").exists():
      with _opened(directory / "model.safetensors") as f:
        weight_map = {k: "model.safetensors" for k in f.keys()}
    else:
      raise CheckpointError(
        f"{directory} has no model.safetensors or model.safetensors.index.json; a Qwen2.5-VL checkpoint "
        "directory saved by transformers (save_pretrained) or downloaded from the hub is expected."
      )
    self.directory, self.weight_map, self._files = directory, weight_map, {}

  def resolve(self, name: str) -> str | None:
    return next((n for n in alt_names(name) if n in self.weight_map), None)

  def slice(self, name: str):
    file = self.weight_map[name]
    if file not in self._files:
      self._files[file] = _opened(self.directory / file)
    return self._files[file].get_slice(name)


def _opened(path: Path):
  """safe_open(path), or a CheckpointError naming the file when it is missing, truncated or not safetensors."""
  try:
    return safe_open(path, "numpy")
  except Exception as e:  # noqa: BLE001 - safetensors' own error type is not importable by a stable name
    size = path.stat().st_size if path.exists() else None
    raise CheckpointError(
      f"{path}: cannot read it as safetensors ({type(e).__name__}: {e}; {size} bytes on disk); the file is "
      "missing, truncated or damaged: copy or download it again"
    ) from e


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


def load_hf_checkpoint(
  directory: str | os.PathLike,
  *,
  mesh: Mesh | None = None,
  dtype=None,
  param_dtype=None,
  layers_apart: bool = False,
  **config_overrides,
) -> Qwen25VL:
  """Builds the family's model (`Qwen25VL`, `Qwen3VL`) from a local HF checkpoint directory.

  Params are stored as `param_dtype` (default: the checkpoint's own, `checkpoint_dtype`; training passes its float32
  masters) and sharded per `jaxcap.sharding` rules over `mesh` (default: the first local device). `dtype` is the
  compute dtype (default: `param_dtype`). `layers_apart`: the decoder stack's leaves (and an untied LM head)
  are left unread, as `LayerReader`s, for a sampler that owns its weights (`hold_for_decoding` reads them a layer at
  a time straight into the decode layout, so the stack is never held); such a model is only for that.
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
  decoder = {name for name, _ in model_cls.decoder_stacks(cfg)}

  def load_one(path, leaf, sharding):
    template, layout = hf_name(path_name(path))
    stacked = "*" in template
    names = layer_names(template, leaf.shape[0] if stacked else 1, stack_indices(path_name(path), cfg))
    tensors = []
    for hf in names:
      found = index.resolve(hf)
      if found is None:
        missing.append(hf)
        continue
      tensor = index.slice(found)
      stored, want = tuple(tensor.get_shape()), hf_shape(leaf.shape[1:] if stacked else leaf.shape, layout, cfg)
      if stored != want:
        raise CheckpointError(
          f"tensor {found!r} in {directory} has shape {stored}, but config.json implies "
          f"{want}; the weights and config.json do not belong together."
        )
      tensors.append(tensor)
    if len(tensors) < len(names):
      return None
    if layers_apart and stacked and path_name(path).split(".")[0] in decoder and layer_axis_whole(sharding):
      return LayerReader(tensors, layout, leaf.shape, param_dtype, sharding)
    if layers_apart and path_name(path) == "lm_head.kernel":  # an untied head: laid out for decoding as it is read
      return LayerReader(tensors, layout, leaf.shape, param_dtype, sharding, stacked=False)
    if stacked:
      return place_stacked(tensors, layout, leaf.shape, param_dtype, sharding)
    return place(tensors[0], layout, leaf.shape, param_dtype, sharding)

  arrays = jax.tree_util.tree_map_with_path(load_one, pure, shardings)
  if missing:
    raise CheckpointError(
      f"{directory} lacks {len(missing)} tensor(s) the config needs, e.g. {missing[:3]}; "
      "is it a complete checkpoint of its model_type (all shards present)?"
    )
  nnx.replace_by_pure_dict(abstract, arrays)
  return nnx.merge(graphdef, abstract)
