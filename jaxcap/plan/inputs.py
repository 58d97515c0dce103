"""The abstract (shape, dtype, sharding) arguments of a run's programs: train state, prompts, rollouts (the RL
update's, from `jaxcap.train.steps.abstract`, which the trainer's memory check compiles too), decode state."""

from __future__ import annotations

from jax.sharding import NamedSharding

import jax

from jaxcap.models.qwen25vl import CACHE_AXES
from jaxcap.sharding import logical_to_spec
from jaxcap.train.steps.abstract import per_device_bytes, rl_step_inputs, with_shardings

__all__ = ["decode_state_shardings", "per_device_bytes", "rl_step_inputs", "with_shardings"]


def decode_state_shardings(state, mesh):
  """The decode state's layout as the sampler keeps it: KV cache and per-row arrays over the batch axes."""

  def one(path, x):
    name = jax.tree_util.keystr(path)
    if "cache" in name:
      logical = CACHE_AXES
    elif x.ndim >= 1 and "prompt_length" not in name:
      logical = ("batch",) + (None,) * (x.ndim - 1)
    else:
      logical = (None,) * x.ndim
    return NamedSharding(mesh, logical_to_spec(logical, x.shape, mesh))

  return jax.tree_util.tree_map_with_path(one, state)
