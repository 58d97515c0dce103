"""The RL update program with abstract arguments (shapes, dtypes, shardings; nothing allocated), for compiling it
ahead of time: `jaxcap.plan` reports its memory and FLOPs on a target, the trainer's memory check
(`jaxcap.train.shell.memory_check`) counts its temporaries before a checkpoint is read.

    update = abstract_rl_update(config, cfg, mesh)      # RunPrograms' own jit, and its abstract arguments
    with jax.set_mesh(mesh):
      compiled = update.update.lower(*update.args).compile()
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding

from jaxcap.models.families import family_of_config, layout_for
from jaxcap.processing.vision import smart_resize
from jaxcap.sharding import logical_to_spec
from jaxcap.train.packing.batch import planned_rows
from jaxcap.train.packing.inputs import PackedInputs
from jaxcap.train.steps.adapters import trains_base, with_run_lora
from jaxcap.train.steps.programs import (
  RunPrograms,
  packs,
  reference_is_base,
  rollout_correction_config,
  with_reference,
)
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


def with_shardings(abstract, shardings):

  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, shardings)


def image_grid(cfg, image_size: int, max_pixels: int = 0) -> tuple[int, int, int]:
  """(t, h, w) patch grid of the largest image a run feeds, after smart_resize (as the processor does): one
  square `image_size` image, or with native sizes (image_size 0) a square one at the `max_pixels` budget."""

  v = cfg.vision
  factor = v.patch_size * v.spatial_merge_size
  if image_size:
    h, w = smart_resize(image_size, image_size, factor)
  elif max_pixels:
    side = int(max_pixels**0.5)
    h, w = smart_resize(side, side, factor, max_pixels=max_pixels)
  else:
    raise SystemExit(
      "data.image_size=0 (native sizes) with data.max_pixels=0 (the checkpoint's budget, up to 12.8 MP per image): "
      "set --config.data.max_pixels (e.g. 200704 = 448 x 448) or --config.data.image_size to plan the run"
    )
  return 1, h // v.patch_size, w // v.patch_size


def rl_step_inputs(config, cfg, mesh, abstract_params, optimizer, text: int = 48, grid=None) -> SimpleNamespace:
  """The abstract arguments (shapes, dtypes, shardings on `mesh`) of the run's RL step at its largest prompt:
  state, prompts, rollouts, layout, plus the sizes they were built from. `grid`: the image's patch grid (default:
  `image_grid` of the data block); `text`: the prompt's tokens besides the image's."""
  rl, s = config.rl, config.sampling
  prompts_total, g, m = rl.batch_size * max(1, config.distributed.num_processes or 1), rl.num_samples, rl.micro_batches
  b = prompts_total // m
  grid = tuple(grid) if grid is not None else image_grid(cfg, config.data.image_size, config.data.max_pixels)
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
    # a KL term's reference log-probs: from the reference copy, or (LoRA) from the base with the adapters off
    ref_logprobs=f32((m, b * g, c), (None, "batch", None)) if with_ref or reference_is_base(config, "rl") else None,
    behaviour_logprobs=f32((m, b * g, c), (None, "batch", None)) if rollout_correction_config(config).enabled else None,
    truncated=arr((m, b * g), jnp.bool_, (None, "batch")) if config.rl.mask_truncated else None,
  )
  return SimpleNamespace(
    state=state, prompts=prompt_batch, rollouts=rollouts, layout=layout, arr=arr, prompts_total=prompts_total, g=g,
    p=p, c=c, grid=grid, patches=patches,
  )  # fmt: skip


def abstract_rl_update(config, cfg, mesh, text: int = 48, grid=None) -> SimpleNamespace:
  """The run's RL update (`RunPrograms.update("rl", ...)`: the trainer's own jit) for model `cfg` (with the run's
  LoRA adapters and quantized base, as the run builds them) and its abstract arguments on `mesh`: `update`, `args`
  (state, prompts, rollouts, layout: packed rows at rl.micro_batch_tokens, as `planned_rows` lays the step out),
  `inputs` (`rl_step_inputs`), `graphdef`, `abstract_params`, `programs`, `optimizer`, `packed_rows` (or None)."""
  model_cls = family_of_config(cfg).model_cls
  graphdef, abstract_params = nnx.split(nnx.eval_shape(lambda: with_run_lora(model_cls(cfg, rngs=nnx.Rngs(0)), config)))
  programs = RunPrograms(config, graphdef)  # the trainer's own builder: the program compiled is the run's
  opt = programs.optimizer("rl")
  inputs = rl_step_inputs(config, cfg, mesh, abstract_params, opt, text, grid)
  prompt_batch, layout, rows = inputs.prompts, inputs.layout, None
  if packs(config):  # packed micro-batches at the budget (rl.micro_batch_tokens): the step's pixels, one pack
    budget_tokens = int(config.rl.micro_batch_tokens)
    with jax.set_mesh(mesh):  # whether the rows share prompts depends on the target's attention kernels
      rows = planned_rows(
        inputs.prompts_total, inputs.g, inputs.p, inputs.c, inputs.grid, budget_tokens, cfg, config.data.bucket_steps
      )
    replicated = lambda x: jax.ShapeDtypeStruct(
      x.shape, x.dtype, sharding=NamedSharding(mesh, logical_to_spec((), (), mesh))
    )
    pixels = inputs.arr((inputs.prompts_total * inputs.patches, cfg.vision.patch_dim), jnp.float32, (None, None))
    layout = PackedInputs(pixels, jax.tree.map(replicated, rows))
    prompt_batch = dataclasses.replace(prompt_batch, pixel_values=None)
  update = programs.update("rl", opt, jax.tree.map(lambda x: x.sharding, inputs.state))
  return SimpleNamespace(
    update=update, args=(inputs.state, prompt_batch, inputs.rollouts, layout), inputs=inputs, graphdef=graphdef,
    abstract_params=abstract_params, programs=programs, optimizer=opt, packed_rows=rows,
  )  # fmt: skip
