"""Where a plan puts the run's programs: the learner's mesh, and the rollouts' (their own devices with
`rollout.devices`, as `jaxcap.train.rollouts.placement` splits them; else the learner's).

On their own devices the rollouts hold a copy of the whole model in the compute dtype (`WeightSync.publish`:
replicated, what the paged engine reads per device anyway) and, while a round decodes, room for the next version
arriving (all of it, or only the adapters when LoRA's base is frozen): that is what stays resident beside their
programs, not the train state."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxcap.models import lora
from jaxcap.plan.inputs import per_device_bytes
from jaxcap.sampling.generate import compute_dtype_params
from jaxcap.sharding import logical_to_spec, make_mesh
from jaxcap.train.rollouts.placement import rollout_mesh, split_devices
from jaxcap.train.steps.adapters import trains_base


@dataclasses.dataclass(frozen=True)
class Layout:
  """learner: the learner's mesh; rollouts: the rollouts' (the learner's when colocated); split: whether they
  differ; first: the first rollout device's one-device mesh (where one paged engine is planned)."""

  learner: Mesh
  rollouts: Mesh
  split: bool
  first: Mesh

  @classmethod
  def of(cls, config, devices, slices: tuple[list, list] | None = None) -> "Layout":
    """`devices` split as the run splits them, or `slices` (learner's, rollouts': two TPU slices, `split_slices`)."""
    train, rollout = slices if slices is not None else split_devices(config.rollout.devices, devices)
    learner = make_mesh(dict(config.mesh.shape), devices=train)
    rollouts = rollout_mesh(rollout) if rollout else learner
    return cls(learner, rollouts, bool(rollout), make_mesh({"data": 1}, devices=(rollout or list(devices))[:1]))

  def arr(self, shape, dtype, logical):
    """An abstract array on the rollouts' mesh, laid out by its logical axes."""
    spec = logical_to_spec(logical, shape, self.rollouts)
    return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(self.rollouts, spec))

  def rollout_params(self, params, dtype):
    """The params the rollouts read: split, a whole compute-dtype copy on each rollout device; else `params`."""
    if not self.split:
      return params
    whole = NamedSharding(self.rollouts, PartitionSpec())
    cast = jax.eval_shape(functools.partial(compute_dtype_params, dtype=dtype), params)
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=whole), cast)

  def sync_bytes(self, config, params, dtype) -> int:
    """Bytes one published version moves onto each rollout device (0 colocated): the compute-dtype params, or
    only the adapters when LoRA's base is frozen."""
    if not self.split:
      return 0
    moved = params
    if config.model.lora.rank > 0 and not trains_base(config, "rl") and lora.has_adapters(params):
      moved = lora.split_trainable(params)[0]
    return per_device_bytes(self.rollout_params(moved, dtype))

  def describe(self) -> dict[str, Any]:
    return {
      "learner": {"devices": self.learner.size, "mesh": dict(self.learner.shape)},
      "rollouts": {"devices": self.rollouts.size, "mesh": dict(self.rollouts.shape)} if self.split else "colocated",
    }
