"""Device mesh and the one table of logical-axis rules: params, activations and the KV cache are annotated here.

Mesh axes are ('data', 'fsdp', 'tensor'): batch over data x fsdp, weights' model dim over fsdp (ZeRO-3 style,
gathered per layer by XLA), heads / MLP hidden / vocab over tensor. A mesh axis that does not divide an array
dimension is dropped for that array (it is replicated instead), so every mesh shape works with every model size.
"""

from __future__ import annotations

import logging
import math
import re
from typing import Any, Callable, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")

# logical axis -> mesh axes
LOGICAL_RULES: dict[str, tuple[str, ...]] = {
  "batch": ("data", "fsdp"),
  "embed": ("fsdp",),
  "heads": ("tensor",),
  "kv_heads": ("tensor",),
  "mlp": ("tensor",),
  "vocab": ("tensor",),
}

# parameter path (dot-joined nnx path) -> logical axes of the array; first match wins.
PARAM_RULES: list[tuple[str, tuple[str | None, ...]]] = [
  (r"embed_tokens\.embedding$", ("vocab", "embed")),
  (r"lm_head\.kernel$", ("embed", "vocab")),
  (r"self_attn\.q_proj\.kernel$", ("embed", "heads")),
  (r"self_attn\.q_proj\.bias$", ("heads",)),
  (r"self_attn\.[kv]_proj\.kernel$", ("embed", "kv_heads")),
  (r"self_attn\.[kv]_proj\.bias$", ("kv_heads",)),
  (r"self_attn\.o_proj\.kernel$", ("heads", "embed")),
  (r"attn\.qkv\.kernel$", ("embed", "heads")),
  (r"attn\.qkv\.bias$", ("heads",)),
  (r"attn\.proj\.kernel$", ("heads", "embed")),
  # Qwen3.5's linear attention: the projections' hidden axis only (its q / k / v concatenation and per-head gates
  # split at head boundaries no mesh axis follows; transformers gathers their outputs too)
  (r"linear_attn\.in_proj_(qkv|z|b|a)\.kernel$", ("embed", None)),
  (r"linear_attn\.out_proj\.kernel$", (None, "embed")),
  (r"(gate_proj|up_proj|fc1)\.kernel$", ("embed", "mlp")),
  (r"(gate_proj|up_proj|fc1)\.bias$", ("mlp",)),
  (r"(down_proj|fc2)\.kernel$", ("mlp", "embed")),
  (r"patch_embed\.kernel$", (None, "embed")),
]


def make_mesh(shape: dict[str, int] | None = None, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A ('data', 'fsdp', 'tensor') mesh. `shape` maps axis -> size; -1 (at most one) takes the remaining devices.

  Default: all devices on 'fsdp'.
  """
  devices = list(devices if devices is not None else jax.devices())
  shape = dict(shape or {"fsdp": -1})
  unknown = set(shape) - set(MESH_AXES)
  if unknown:
    raise ValueError(f"unknown mesh axes {sorted(unknown)}; use {MESH_AXES}")
  sizes = [shape.get(a, 1) for a in MESH_AXES]
  if sizes.count(-1) > 1:
    raise ValueError(f"mesh shape {shape}: at most one axis may be -1")
  known = math.prod(s for s in sizes if s != -1)
  sizes = [len(devices) // known if s == -1 else s for s in sizes]
  if math.prod(sizes) != len(devices):
    raise ValueError(f"mesh shape {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} devices, have {len(devices)}")
  return Mesh(np.asarray(devices).reshape(sizes), MESH_AXES)


def logical_to_spec(logical: Sequence[str | None], shape: Sequence[int], mesh: Mesh | Any) -> P:
  """PartitionSpec for an array of `shape` with the given logical axes on `mesh` (drops non-dividing axes)."""
  spec, used = [], set()
  for name, dim in zip(logical, shape):
    axes = []
    for ax in LOGICAL_RULES.get(name, ()) if name else ():
      size = mesh.shape[ax]
      if ax in used or size == 1 or dim % (math.prod(mesh.shape[a] for a in axes) * size):
        continue
      axes.append(ax)
    used.update(axes)
    spec.append(tuple(axes) if len(axes) > 1 else (axes[0] if axes else None))
  return P(*spec)


def param_logical_axes(path: str, ndim: int) -> tuple[str | None, ...]:
  """Logical axes of the param at dot-joined `path`; leading axes beyond the rule's (the layer axis of stacked
  layers) are unsharded. Paths may carry nnx's trailing `.value` and any prefix (e.g. an optimizer state's)."""
  path = re.sub(r"\.value$", "", path)
  # qwix's quantized kernel (QLoRA) {qvalue, scale} lies like the kernel; LoRA's A [in, r] takes the kernel's input
  # axis, B [r, out] its output axis, the rank dimension unsharded
  path = re.sub(r"\.kernel\.array\.(qvalue|scale)$", ".kernel", path)
  adapter = re.search(r"\.kernel_lora_([ab])$", path)
  if adapter:
    axes = param_logical_axes(path[: adapter.start()] + ".kernel", 2)
    axes = (axes[0], None) if adapter.group(1) == "a" else (None, axes[1])
    return (None,) * (ndim - 2) + axes
  for pattern, axes in PARAM_RULES:
    if re.search(pattern, path):
      return (None,) * (ndim - len(axes)) + tuple(axes)
  return (None,) * ndim


def path_name(path) -> str:
  """'a.b.0.c' for a pytree key path."""
  return ".".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path)


def param_shardings(abstract_params: Any, mesh: Mesh) -> Any:
  """NamedSharding for every leaf of a tree whose leaf paths end in param paths: an nnx param state, a pure
  dict, or an optimizer state holding per-param moments (scalars such as step counts are replicated)."""

  def one(path, leaf):
    shape = getattr(leaf, "shape", ())
    spec = logical_to_spec(param_logical_axes(path_name(path), len(shape)), shape, mesh)
    return NamedSharding(mesh, spec)

  return jax.tree_util.tree_map_with_path(one, abstract_params)


def shard(x: jax.Array, logical: Sequence[str | None]) -> jax.Array:
  """Constrains an activation to its logical layout under the ambient mesh (`jax.set_mesh`); no-op without one."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or not set(MESH_AXES) <= set(mesh.axis_names):
    return x
  return jax.lax.with_sharding_constraint(x, logical_to_spec(logical, x.shape, mesh))


def init_sharded(make: Callable[[], nnx.Module], mesh: Mesh) -> nnx.Module:
  """The module `make()` builds (e.g. a freshly initialised model), with every param created directly in its
  sharding on `mesh`: shapes from an abstract trace, then one jitted init with out_shardings; no device ever
  holds a full copy and no process fetches a global array."""
  graphdef, abstract = nnx.split(nnx.eval_shape(make))
  shardings = param_shardings(abstract, mesh)
  state = jax.jit(lambda: nnx.split(make())[1], out_shardings=shardings)()
  return nnx.merge(graphdef, state)


def reshard(tree: Any, shardings: Any) -> Any:
  """`tree` with every leaf in its target sharding: leaves already there are kept (no copy), others are moved
  by one jitted identity, which works for arrays that span several processes (no host round trip)."""
  leaves, treedef = jax.tree.flatten(tree)
  targets = treedef.flatten_up_to(shardings)
  moving = [i for i, (x, s) in enumerate(zip(leaves, targets)) if not _has_sharding(x, s)]
  if moving:
    moved = jax.jit(lambda xs: xs, out_shardings=[targets[i] for i in moving])([leaves[i] for i in moving])
    for i, x in zip(moving, moved):
      leaves[i] = x
  return treedef.unflatten(leaves)


def _has_sharding(x, sharding) -> bool:
  s = getattr(x, "sharding", None)
  return s is not None and s.is_equivalent_to(sharding, x.ndim)


def replicated_leaves(tree: Any, mesh: Mesh, min_bytes: int = 1 << 20) -> list[tuple[str, tuple, int]]:
  """(path, shape, bytes) of every array of at least `min_bytes` that is fully replicated although `mesh` has
  more than one device: a copy on every chip."""
  if mesh.size == 1:
    return []
  found = []
  for path, x in jax.tree_util.tree_leaves_with_path(tree):
    sharding = getattr(x, "sharding", None)
    nbytes = getattr(x, "nbytes", 0)
    if sharding is not None and nbytes >= min_bytes and sharding.is_fully_replicated:
      found.append((path_name(path), tuple(x.shape), int(nbytes)))
  return found


def warn_replicated(tree: Any, mesh: Mesh, min_bytes: int = 1 << 20) -> list:
  """Logs once, listing them, the large arrays of `tree` that no rule shards on `mesh` (a mesh axis that does not
  divide a dimension leaves it replicated); returns them."""
  found = replicated_leaves(tree, mesh, min_bytes)
  if found:
    total = sum(b for *_, b in found)
    listing = "\n".join(f"  {p} {s} {b / 2**20:.1f} MiB" for p, s, b in found[:20])
    logging.warning(
      "%d array(s) of >= %.1f MiB are replicated on all %d devices of mesh %s (%.1f MiB per device); add a rule "
      "in jaxcap/sharding.py PARAM_RULES or pick mesh sizes that divide their dimensions:\n%s",
      len(found),
      min_bytes / 2**20,
      mesh.size,
      dict(mesh.shape),
      total / 2**20,
      listing,
    )
  return found


def shard_like_params(tree: Any) -> Any:
  """Constrains every leaf of a params-shaped tree (gradients, their accumulator) to the params' layout under the
  ambient mesh, so e.g. the float32 gradient accumulator is sharded like the weights, never replicated."""
  return jax.tree_util.tree_map_with_path(
    lambda path, x: shard(x, param_logical_axes(path_name(path), x.ndim)) if hasattr(x, "ndim") else x, tree
  )


def put_replicated_value(tree: Any, shardings: Any) -> Any:
  """Places host-identical values (same seed / same state on every process) onto global shardings.

  Unlike `jax.device_put`, this also works when the sharding spans devices of other processes: each process
  fills only its own shards from its copy of the value.
  """

  def put(x, sharding):
    if isinstance(x, jax.Array) and not x.is_fully_addressable:  # already global: move on device, never fetch
      return reshard(x, sharding)
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):  # typed keys travel as their raw key data
      impl = jax.random.key_impl(x)
      data = put(jax.random.key_data(x), NamedSharding(sharding.mesh, P()))
      return jax.random.wrap_key_data(data, impl=impl)
    host = np.asarray(jax.device_get(x))
    return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])

  return jax.tree.map(put, tree, shardings)
