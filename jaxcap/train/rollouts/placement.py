"""Where rollouts run, and how the learner's weights reach them.

    train, rollout = split_devices(rollout_devices=2)      # per process: its first 2 devices roll out
    sync = WeightSync(rollout_mesh(rollout), "bfloat16", adapters_only=True)
    weights = sync.publish(state.params)                   # a copy the rollouts read, on their devices

Disaggregated (`rollout.devices` = n > 0): each process gives its first n local devices to the rollouts and the
rest to the learner, so both meshes span every process and each process rolls out and trains on its own block of
the global batch (nothing of a round crosses processes). Colocated (n = 0): the rollouts share the learner's mesh.

`WeightSync.publish` is the one way weights move to the rollouts: the float masters cast to the compute dtype on
the learner's devices (half the bytes to move), then one `jax.device_put` onto the rollout mesh, replicated (each
rollout device runs the whole model: the paged engine's data parallelism; no collective is then left for the
rollout thread, so its programs never interleave with the learner's collectives). Device to device: nothing goes
through host memory (tests/train/test_fully_async.py runs it under a transfer guard that forbids host copies).
With LoRA (base frozen) only the adapters move after the first publish; the base copy on the rollout devices is
reused. Every published version is a copy: the learner's update donates its state, and a round may still be
decoding from an older version.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxcap.models import lora
from jaxcap.sharding import logical_to_spec, make_mesh


def split_devices(rollout_devices: int, devices: Sequence[jax.Device] | None = None) -> tuple[list, list]:
  """(learner devices, rollout devices): of each process's devices (by id) the first `rollout_devices` roll out;
  `rollout_devices` = 0: ([all], [])."""
  devices = list(devices if devices is not None else jax.devices())
  if not rollout_devices:
    return devices, []
  by_process: dict[int, list] = {}
  for d in sorted(devices, key=lambda d: (d.process_index, d.id)):
    by_process.setdefault(d.process_index, []).append(d)
  local = min(len(v) for v in by_process.values())
  if rollout_devices >= local:
    raise ValueError(
      f"rollout.devices={rollout_devices} leaves the learner no device of the {local} each process has; use 1 to "
      f"{local - 1}, or 0 to share them"
    )
  rollout = [d for ds in by_process.values() for d in ds[:rollout_devices]]
  train = [d for ds in by_process.values() for d in ds[rollout_devices:]]
  return train, rollout


def rollout_mesh(devices: Sequence[jax.Device]) -> Mesh:
  """The rollout devices as one data-parallel mesh (each holds whole prompts' groups and a copy of the model)."""
  return make_mesh({"data": -1}, devices)


@dataclasses.dataclass
class WeightSync:
  """`publish(params) -> params` on `mesh`, replicated, floats in `dtype` (see the module docstring).
  `adapters_only`: the base is frozen (LoRA): after the first publish only the adapters move."""

  mesh: Mesh
  dtype: Any
  adapters_only: bool = False
  _base: Any = None  # the frozen base on the rollout devices, moved once
  moved_bytes: int = 0  # bytes moved to the rollout devices so far (tests, metrics)

  def publish(self, params):
    replicated = NamedSharding(self.mesh, PartitionSpec())
    if self.adapters_only and lora.has_adapters(params):
      adapters, base = lora.split_trainable(params)
      if self._base is None:
        self._base = self._move(base, replicated)
      return lora.join(self._move(adapters, replicated), self._base)
    return self._move(params, replicated)

  def _move(self, tree, sharding):
    cast = _cast_copy(tree, jnp.dtype(self.dtype))  # on the learner's devices: fresh buffers, never donated
    self.moved_bytes += sum(x.nbytes for x in jax.tree.leaves(cast))
    return jax.device_put(cast, sharding)


@functools.partial(jax.jit, static_argnames="dtype")
def _cast_copy(tree, dtype):
  """Float leaves wider than `dtype` cast to it, the rest copied: a new buffer per leaf (jit outputs never alias
  inputs that are not donated)."""

  def cast(x):
    wider = jnp.issubdtype(x.dtype, jnp.floating) and jnp.dtype(x.dtype).itemsize > dtype.itemsize
    return x.astype(dtype) if wider else jnp.copy(x)

  return jax.tree.map(cast, tree)


def onto(tree, mesh: Mesh):
  """`tree`'s arrays on `mesh`, their leading (batch) axis sharded as the batch is there: those already on its
  devices as they are, the others copied device to device (rollouts generated on the rollout devices)."""
  devices = set(mesh.devices.flat)

  def put(x):
    if x is None or set(x.sharding.device_set) == devices:
      return x
    spec = logical_to_spec(("batch",) + (None,) * (x.ndim - 1), x.shape, mesh)
    return jax.device_put(x, NamedSharding(mesh, spec))

  return jax.tree.map(put, tree)
