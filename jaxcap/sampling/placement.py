"""A bucketed prompt batch (`SamplerBatch`) and its upload: onto the ambient mesh, or, with several processes,
as every process's block of one global batch."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from jaxcap.buckets import DEFAULT_STEPS
from jaxcap.sampling.prompts import Prompts, VisionItems, pad_length, pad_patches
from jaxcap.sharding import logical_to_spec


@dataclasses.dataclass(frozen=True)
class SamplerBatch:
  """Prompts padded to their bucket (`Sampler.bucket`, host numpy) or on device (`Sampler.place`): `prompts` holds
  `block` rows per process, the first `rows` real; on device with several processes it is the global batch,
  this process's block starting at global row `first_row`. `packs`: the vision items of each process's block
  (host; this process's alone before `place`, every process's in process order after), or None without vision."""

  prompts: Prompts
  rows: int
  block: int
  first_row: int = 0
  packs: tuple[VisionItems, ...] | None = None

  @property
  def on_device(self) -> bool:
    return isinstance(self.prompts.input_ids, jax.Array)


def place_batch(batch: SamplerBatch, cfg, pad_id: int, steps: int = DEFAULT_STEPS) -> SamplerBatch:
  """`Sampler.place` for any bucketed batch (`bucket_prompts`): uploads it under the ambient mesh, the processes'
  blocks forming one global batch."""
  if batch.on_device:
    return batch
  if jax.process_count() > 1:
    prompts, packs = _to_global(batch, cfg, pad_id, steps)
    return dataclasses.replace(
      batch, prompts=prompts, first_row=_first_row(prompts.input_ids, batch.block), packs=packs
    )
  return dataclasses.replace(batch, prompts=_to_device(batch.prompts))


def _to_global(batch: SamplerBatch, cfg, pad_id: int, steps: int) -> tuple[Prompts, tuple[VisionItems, ...] | None]:
  """Multi-process: every process's host batch becomes its block of one global batch (process order).

  The processes first agree on one bucket (the largest prompt length and vision pack any of them needs; one small
  host all-gather), pad their own arrays to it, and lay out every process's images in one global vision layout."""
  from jaxcap.models.vision import layout_shape, vision_layout
  from jaxcap.multihost import allgather_ints

  mesh = jax.sharding.get_mesh()
  if mesh is None or mesh.empty:
    raise ValueError("multi-process sampling needs an ambient mesh: call it under `with jax.set_mesh(mesh):`")
  n = jax.process_count()
  prompts, mine = batch.prompts, (batch.packs or (None,))[0]
  local = [batch.block, prompts.length, int(mine is not None)]
  if mine is not None:
    local += [mine.patches, *np.asarray(mine.rows).tolist(), *np.asarray(mine.grid_thw).reshape(-1).tolist()]
  everyone = allgather_ints(np.asarray(local, np.int64))
  blocks = {int(e[0]) for e in everyone}
  if len(blocks) > 1:
    raise ValueError(f"processes hold {sorted(blocks)} prompt rows; every process must pass a batch of one size")
  prompts = pad_length(prompts, max(int(e[1]) for e in everyone), pad_id)
  packs = None
  if any(int(e[2]) for e in everyone):
    if not all(int(e[2]) for e in everyone):
      raise ValueError("some processes' prompts have images and others' none; every process needs vision items")
    packs = tuple(_decode_items(e[3:]) for e in everyone)
    shape = layout_shape([p.grid_thw for p in packs], cfg.vision).bucketed(cfg.vision, steps)
    shape = dataclasses.replace(shape, patches=max(shape.patches, *(p.patches for p in packs)))
    packs = tuple(dataclasses.replace(p, patches=shape.patches) for p in packs)
    layout = vision_layout([p.grid_thw for p in packs], cfg.vision, shape)
    pixels = pad_patches(prompts.vision.pixel_values, shape.patches)
    prompts = dataclasses.replace(prompts, vision=type(prompts.vision)(pixels, layout))

  def place(x, logical):
    global_shape = list(np.shape(x))
    axis = list(logical).index("batch")
    global_shape[axis] *= n
    spec = logical_to_spec(logical, global_shape, mesh)
    if spec[axis] is None:
      raise ValueError(
        f"a global batch of {global_shape[axis]} does not split over the mesh's batch axes "
        f"{dict(mesh.shape)}; use a per-process batch that divides evenly"
      )
    return jax.make_array_from_process_local_data(NamedSharding(mesh, spec), np.asarray(x), tuple(global_shape))

  vision = prompts.vision
  if vision is not None:
    replicated = NamedSharding(mesh, jax.sharding.PartitionSpec())
    vision = type(vision)(
      place(vision.pixel_values, ("batch", None)),
      jax.tree.map(lambda x: jax.make_array_from_process_local_data(replicated, x), vision.layout),
    )
  placed = Prompts(
    place(prompts.input_ids, ("batch", None)),
    place(prompts.attention_mask, ("batch", None)),
    place(prompts.positions, (None, "batch", None)),
    place(prompts.rope_deltas, ("batch",)),
    vision,
  )
  return placed, packs


def _decode_items(flat: np.ndarray) -> VisionItems:
  """Inverse of the all-gathered [patches, rows..., grids...] of one process (N items: 1 + N + 3N ints)."""
  count = (len(flat) - 1) // 4
  return VisionItems(flat[1 + count :].reshape(count, 3), flat[1 : 1 + count].astype(np.int32), int(flat[0]))


def _first_row(ids: jax.Array, block: int) -> int:
  """The global row at which this process's block of `block` rows starts in the batch-sharded `ids`."""
  starts = {s.index[0].indices(ids.shape[0])[:2] for s in ids.addressable_shards}
  lo, hi = min(a for a, _ in starts), max(b for _, b in starts)
  if hi - lo != block:
    raise ValueError(f"this process's rows [{lo}, {hi}) of the global batch are not one block of {block}")
  return lo


def _to_device(prompts: Prompts) -> Prompts:
  """Puts a host batch on device: batch-sharded under the ambient mesh, else on the default device."""
  mesh = jax.sharding.get_mesh()
  if mesh is None or mesh.empty:
    return jax.tree.map(jnp.asarray, prompts)
  place = lambda x, logical: jax.device_put(x, NamedSharding(mesh, logical_to_spec(logical, x.shape, mesh)))
  vision = prompts.vision
  return Prompts(
    place(prompts.input_ids, ("batch", None)),
    place(prompts.attention_mask, ("batch", None)),
    place(prompts.positions, (None, "batch", None)),
    place(prompts.rope_deltas, ("batch",)),
    None if vision is None else jax.tree.map(lambda x: place(x, (None,) * x.ndim), vision),
  )
