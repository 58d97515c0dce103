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
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding
from safetensors import safe_open

from jaxcap.checkpoint.hf_layout import alt_names, from_hf_layout, hf_name, hf_shape, layer_names, path_name
from jaxcap.checkpoint.precision import checkpoint_dtype
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
      with safe_open(directory / "model.safetensors", "numpy") as f:
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
  compute dtype (default: `param_dtype`). `layers_apart`: the decoder stack's leaves are left unread, as
  `LayerReader`s, for a sampler that owns its weights (`hold_for_decoding` reads them a layer at a time into the
  decode layout, so the stack is never held); such a model is only for that.
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
    template, layout = hf_name(path_name(path))
    stacked = "*" in template
    names = layer_names(template, leaf.shape[0] if stacked else 1)
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
    if stacked and layers_apart and path_name(path).startswith("layers.") and _layer_axis_whole(sharding):
      return LayerReader(tensors, layout, leaf.shape, param_dtype, sharding)
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


def _aligned_empty(shape: tuple, dtype) -> np.ndarray:
  """An uninitialised host buffer whose data starts on a 64-byte boundary. XLA:CPU adopts such a buffer as the device
  array's memory (zero-copy) where numpy's default 16-byte alignment makes it copy, so a leaf read into one is never
  held twice."""
  dtype = np.dtype(dtype)
  nbytes = int(np.prod(shape)) * dtype.itemsize
  raw = np.empty(nbytes + _ALIGN, np.uint8)
  start = -raw.ctypes.data % _ALIGN
  return raw[start : start + nbytes].view(dtype).reshape(shape)


_ALIGN = 64


def _read_into(out: np.ndarray, tensor, layout: str, idx: tuple) -> np.ndarray:
  """Reads the block `idx` (jaxcap layout) of a lazy safetensors slice into `out`, converting its dtype, in runs of
  the stored tensor's first axis of about `_CHUNK` bytes: only one run's read buffer is held beside `out`."""
  if layout == "conv":  # small; read whole
    out[...] = from_hf_layout(tensor[:], layout)[idx]
    return out
  if out.size == 0:
    return out
  axis = 1 if layout == "t" else 0  # the stored first axis in jaxcap's layout
  stored = range(tensor.get_shape()[0])[idx[axis]]
  step = max(1, _CHUNK // max(1, out.nbytes // len(stored)))
  for start in range(0, len(stored), step):
    run = slice(stored[start], stored[min(start + step, len(stored)) - 1] + 1)
    if layout == "t":
      out[:, start : start + step] = np.asarray(tensor[run, idx[0]]).T
    else:
      out[start : start + step] = np.asarray(tensor[(run,) + tuple(idx[1:])])
  return out


_CHUNK = 64 * 2**20


def _full(idx, ndim: int) -> tuple:
  return tuple(idx) + (slice(None),) * (ndim - len(idx))


def _block_shape(idx: tuple, shape) -> tuple:
  return tuple(len(range(n)[i]) for i, n in zip(idx, shape))


def _place(tensor, layout: str, shape, dtype, sharding) -> jax.Array:
  """A device array holding `tensor` (lazy safetensors slice) in jaxcap layout, each shard read separately."""

  def read(idx):
    idx = _full(idx, len(shape))
    return _read_into(_aligned_empty(_block_shape(idx, shape), dtype), tensor, layout, idx)

  return jax.make_array_from_callback(tuple(shape), sharding, read)


class LayerReader:
  """A stacked [L, ...] decoder leaf left on disk (`load_hf_checkpoint(layers_apart=True)`): `layer(i)` reads
  layer i into a device array of its own, the leaf's sharding less the layer axis."""

  def __init__(self, tensors: list, layout: str, shape, dtype, sharding):
    self.tensors, self.layout, self.shape, self.dtype = tensors, layout, tuple(shape), np.dtype(dtype)
    if isinstance(sharding, NamedSharding):
      sharding = NamedSharding(sharding.mesh, PartitionSpec(*sharding.spec[1:]))
    self.sharding = sharding

  @property
  def ndim(self) -> int:
    return len(self.shape)

  def layer(self, i: int) -> jax.Array:
    return _place(self.tensors[i], self.layout, self.shape[1:], self.dtype, self.sharding)

  def delete(self) -> None:  # as a jax.Array's: nothing is held
    pass


def _layer_axis_whole(sharding) -> bool:
  return not isinstance(sharding, NamedSharding) or not sharding.spec or sharding.spec[0] is None


def _place_stacked(tensors: list, layout: str, shape, dtype, sharding) -> jax.Array:
  """A stacked [L, ...] device array from L per-layer tensors; each device reads only its block of each layer,
  layer by layer into one aligned buffer (peak: the block plus one layer's read)."""

  def read(idx):
    idx = _full(idx, len(shape))
    out = _aligned_empty(_block_shape(idx, shape), dtype)
    for row, layer in enumerate(range(len(tensors))[idx[0]]):
      _read_into(out[row], tensors[layer], layout, idx[1:])
    return out

  return jax.make_array_from_callback(tuple(shape), sharding, read)
