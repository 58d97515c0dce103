"""The abstract (shape, dtype, sharding) arguments of a run's programs: train state, prompts, rollouts, decode state."""

from __future__ import annotations

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from jaxcap.models.families import layout_for
from jaxcap.models.qwen25vl import CACHE_AXES
from jaxcap.plan.topology import image_grid
from jaxcap.sharding import logical_to_spec
from jaxcap.train.steps.adapters import trains_base
from jaxcap.train.steps.programs import rollout_correction_config, with_reference
from jaxcap.train.steps.state import _fresh_state, train_state_shardings
from jaxcap.train.steps.updates import PromptBatch, RolloutBatch


def per_device_bytes(tree) -> int:
  """Bytes one device holds of a tree of sharded ShapeDtypeStructs / arrays (the first device's shard)."""

  total = 0
  for x in jax.tree.leaves(tree):
    shape = x.sharding.shard_shape(x.shape) if getattr(x, "sharding", None) is not None else x.shape
    bits = 64 if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else jax.dtypes.itemsize_bits(x.dtype)
    total += int(np.prod(shape)) * bits // 8  # 4-bit types (QLoRA's int4 / nf4 base): half a byte
  return total


def rl_step_inputs(config, cfg, mesh, abstract_params, optimizer, text: int = 48) -> SimpleNamespace:
  """The abstract arguments (shapes, dtypes, shardings on `mesh`) of the run's RL step at its largest prompt:
  state, prompts, rollouts, layout, plus the sizes they were built from."""
  rl, s = config.rl, config.sampling
  prompts_total, g, m = rl.batch_size * max(1, config.distributed.num_processes or 1), rl.num_samples, rl.micro_batches
  b = prompts_total // m
  grid = image_grid(cfg, config.data.image_size, config.data.max_pixels)
  patches = int(np.prod(grid))
  vision_tokens = patches // cfg.vision.spatial_merge_size**2
  mult = config.data.pad_to_multiple
  p = -(-(vision_tokens + text) // mult) * mult
  c = s.max_new_tokens
  with_ref = with_reference(config, "rl")
  key = jax.eval_shape(lambda: jax.random.key(0))
  base = trains_base(config, "rl")  # False: RL trains the adapters (or everything)
  abstract_state = jax.eval_shape(lambda prm, k: _fresh_state(prm, optimizer, k, with_ref, base), abstract_params, key)
  state = with_shardings(abstract_state, train_state_shardings(abstract_state, mesh))

  def arr(shape, dtype, logical):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, logical_to_spec(logical, shape, mesh)))

  layout = layout_for(np.asarray([grid] * b), cfg.vision)
  prompt_batch = PromptBatch(
    arr((m, b, p), jnp.int32, (None, "batch", None)),
    arr((m, 3, b, p), jnp.int32, (None, None, "batch", None)),
    arr((m, b, p), jnp.bool_, (None, "batch", None)),
    arr((m, b * patches, cfg.vision.patch_dim), jnp.float32, (None, "batch", None)),
  )
  f32 = lambda shape, logical: arr(shape, jnp.float32, logical)
  rollouts = RolloutBatch(
    tokens=arr((m, b * g, c), jnp.int32, (None, "batch", None)),
    mask=arr((m, b * g, c), jnp.bool_, (None, "batch", None)),
    old_logprobs=f32((m, b * g, c), (None, "batch", None)),
    rewards=f32((m, b, g, 1), (None, "batch", None, None)),
    reward_valid=arr((m, b, g, 1), jnp.bool_, (None, "batch", None, None)),
    weights=f32((1,), (None,)),
    ref_logprobs=f32((m, b * g, c), (None, "batch", None)) if with_ref else None,
    behaviour_logprobs=f32((m, b * g, c), (None, "batch", None)) if rollout_correction_config(config).enabled else None,
    truncated=arr((m, b * g), jnp.bool_, (None, "batch")) if config.rl.mask_truncated else None,
  )
  return SimpleNamespace(
    state=state, prompts=prompt_batch, rollouts=rollouts, layout=layout, arr=arr, prompts_total=prompts_total, g=g,
    p=p, c=c, grid=grid, patches=patches,
  )  # fmt: skip


def with_shardings(abstract, shardings):

  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, shardings)


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
