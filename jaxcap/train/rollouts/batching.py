"""Records -> device batches: chat prompts through the processor, a leading micro-batch axis, and global arrays
sharded over the mesh's batch axes.

The host half (`inputs`: images decoded, processed and padded, numpy only) runs ahead on the loader's thread; the
device half uploads a step's prompts once (`place`) and derives every other layout a step needs on device: the
micro-batched prompts of the update from the sampler's placed batch (`prompt_batch`), and the micro-batched
tokens, masks and log-probs from the rollout's global arrays (`rollout_batch`)."""

from __future__ import annotations

import functools
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxcap.buckets import DEFAULT_STEPS
from jaxcap.data.records import ImageRecord
from jaxcap.models.families import layout_for, layout_shape_for
from jaxcap.models.vision import VisionLayout, stack_layouts
from jaxcap.processing import Processor
from jaxcap.sampling.prompts import bucket_prompts
from jaxcap.sampling.placement import SamplerBatch, place_batch
from jaxcap.sampling.rollouts import SampledArrays
from jaxcap.sharding import logical_to_spec
from jaxcap.train.rollouts import loader as data_lib
from jaxcap.train.steps.updates import PromptBatch

# Logical axes of a PromptBatch's fields; whole images per device when the micro-batch divides the batch axes.
PROMPT_AXES = {
  "ids": (None, "batch", None),
  "positions": (None, None, "batch", None),
  "mask": (None, "batch", None),
  "pixel_values": (None, "batch", None),
}


class Batcher:
  """Turns records into device batches with a leading micro-batch axis, sharded over the batch axes."""

  def __init__(self, processor: Processor, config, mesh, *, media_threads: int | None = None):
    self.processor, self.config, self.mesh = processor, config, mesh
    self.media_threads = media_threads or min(8, os.cpu_count() or 1)
    self._pool: ThreadPoolExecutor | None = None
    self._processing = threading.Lock()  # the loader's and the evaluation's threads share one processor
    self._layouts: dict = {}  # micro-batch layouts by vision items, oldest dropped first
    self.bucket_steps = int(config.data.bucket_steps)
    pad = getattr(processor.tokenizer, "pad_token_id", None)
    self.pad_id = int(pad) if pad is not None else int(processor.cfg.eos_token_id)

  def inputs(self, records: Sequence[ImageRecord], prompts: Sequence[str] | None = None):
    """The processor's batch (host numpy) of `records`' prompts: each record's media then its text of `prompts`
    (default: each record's own prompt, else `data.prompt`); the media are decoded on a few threads."""
    d = self.config.data
    vision_cfg = self.processor.vision_cfg
    prompts = [r.prompt or d.prompt for r in records] if prompts is None else list(prompts)
    if len(prompts) != len(records):
      raise ValueError(f"{len(prompts)} prompts for {len(records)} records; give one per record")
    load = lambda r, p: data_lib.conversation(
      r, p, d.image_size, video_cfg=self.processor.video_cfg, max_image_pixels=vision_cfg.max_image_pixels
    )
    if self.media_threads > 1 and len(records) > 1:
      if self._pool is None:
        self._pool = ThreadPoolExecutor(self.media_threads, thread_name_prefix="media")
      convs = list(self._pool.map(load, records, prompts))
    else:
      convs = [load(r, p) for r, p in zip(records, prompts)]
    with self._processing:
      return self.processor(convs, padding_side="left", pad_to_multiple_of=d.pad_to_multiple)

  def host_prompts(self, inputs, num_micro: int) -> SamplerBatch:
    """ModelInputs of B prompts -> the same batch padded to its bucket (host numpy, `bucket_prompts`): images of
    any sizes in one padded pack, split into `num_micro` micro-batches on device by `prompt_batch`."""
    if inputs.input_ids.shape[0] % num_micro:
      raise ValueError(f"batch of {inputs.input_ids.shape[0]} prompts does not split into {num_micro} micro-batches")
    cfg = self.processor.cfg
    padded, rows, items = bucket_prompts(
      inputs, cfg, length_multiple=self.config.data.pad_to_multiple, pad_id=self.pad_id, steps=self.bucket_steps
    )
    return SamplerBatch(padded, rows, padded.batch, 0, None if items is None else (items,))

  def prompts(self, inputs, num_micro: int):
    """ModelInputs of B prompts (or `host_prompts` of them) -> (PromptBatch [M, B/M, ...] on device, the
    micro-batches' VisionLayouts [M, ...] or None)."""
    batch = inputs if isinstance(inputs, SamplerBatch) else self.host_prompts(inputs, num_micro)
    return self.prompt_batch(self.place_prompts(batch), num_micro)

  def place_prompts(self, batch: SamplerBatch) -> SamplerBatch:
    """A host batch (`host_prompts`) on device, as the sampler places its batches (`place_batch`)."""
    return place_batch(batch, self.processor.cfg, self.pad_id, self.bucket_steps)

  def prompt_batch(self, placed: SamplerBatch, num_micro: int, vision: bool = True):
    """The update's (PromptBatch [M, B/M, ...], VisionLayouts [M, ...]) from a placed batch (the sampler's), on
    device: bucket rows dropped, every process's micro-batch m in micro-batch m, each micro-batch's images
    gathered from the placed pack into a pack of its own (all padded to one bucketed layout shape); without
    `vision` (the packed passes read the placed pack) no pixels and no layouts."""
    p, rows, block = placed.prompts, placed.rows, placed.block
    if rows % num_micro:
      raise ValueError(f"batch of {rows} prompts does not split into {num_micro} micro-batches")
    procs, mb = p.batch // block, rows // num_micro
    t = p.input_ids.shape[1]
    specs = ((1, block, rows), (0, block, rows), (0, block, rows))  # positions, ids, mask: (axis, block, real)
    shapes = {"ids": (num_micro, procs * mb, t), "positions": (num_micro, 3, procs * mb, t)}
    shapes["mask"] = shapes["ids"]
    names = ("positions", "ids", "mask")
    shardings = tuple(self.sharding(PROMPT_AXES[n], shapes[n]) for n in names)
    out = dict(zip(names, _relayout_fn(specs, procs, num_micro, shardings)(p.positions, p.input_ids, p.attention_mask)))
    pixels, layouts = None, None
    if p.vision is not None and vision:
      index, layouts = self.micro_layouts(placed.packs, mb, num_micro)
      shape = (num_micro, index.shape[1], p.vision.pixel_values.shape[1])
      pixels = _gather_fn(self.sharding(PROMPT_AXES["pixel_values"], shape))(p.vision.pixel_values, index)
    return PromptBatch(out["ids"], out["positions"], out["mask"], pixels), layouts

  def micro_layouts(self, packs, rows_per_micro: int, num_micro: int):
    """`micro_packs` on device (replicated), computed and uploaded once per distinct set of vision items (a run
    whose images share one size, like the embedded default's, reuses one)."""
    key = (rows_per_micro, num_micro, tuple((p.patches, p.rows.tobytes(), p.grid_thw.tobytes()) for p in packs))
    if key not in self._layouts:
      if len(self._layouts) >= 64:
        self._layouts.pop(next(iter(self._layouts)))
      replicated = NamedSharding(self.mesh, P())
      put = lambda x: jax.make_array_from_process_local_data(replicated, x)
      layouts = micro_packs(packs, rows_per_micro, num_micro, self.processor.cfg.vision, self.bucket_steps)
      self._layouts[key] = jax.tree.map(put, layouts)
    return self._layouts[key]

  def rollout_batch(
    self, arrays: SampledArrays, placed: SamplerBatch, num_samples: int, num_micro: int, with_logprobs: bool = True
  ):
    """(tokens int [M, b*G, N], completion mask bool [M, b*G, N], the sampling policy's log-probs float
    [M, b*G, N] or None) from a rollout's global device arrays, in the update's layout and shardings, on
    device."""
    g, rows, block = num_samples, placed.rows, placed.block
    procs = arrays.tokens.shape[0] // (block * g)
    n = arrays.tokens.shape[1]
    sharding = self.sharding((None, "batch", None), (num_micro, procs * rows * g // num_micro, n))
    fn = _rollout_fn(procs, block * g, rows * g, num_micro, sharding, with_logprobs)
    return fn(arrays.tokens, arrays.lengths, arrays.policy_logprobs if with_logprobs else None)

  def sharding(self, logical, shape) -> NamedSharding:
    return NamedSharding(self.mesh, logical_to_spec(tuple(logical)[: len(shape)], tuple(shape), self.mesh))

  def place(self, tree, logical: dict | None = None):
    """Host arrays (this process's rows) -> global device arrays sharded over ('data', 'fsdp') on their batch
    axis; with several processes the global batch axis is every process's rows in process order."""
    procs = jax.process_count()

    def put(path, x):
      if x is None:
        return None
      name = str(getattr(path[0], "name", getattr(path[0], "key", ""))) if path else ""
      axes = tuple((logical or {}).get(name, (None, "batch") + (None,) * (np.ndim(x) - 2)))[: np.ndim(x)]
      shape = list(np.shape(x))
      if procs > 1 and "batch" in axes:
        # The spec follows the global shape: a local batch of 1 row is still split over the processes.
        shape[axes.index("batch")] *= procs
      sharding = self.sharding(axes, shape)
      if procs > 1 and "batch" in axes and sharding.spec[axes.index("batch")] is None:
        raise ValueError(
          f"a global batch of {shape[axes.index('batch')]} ({name or 'array'} {tuple(shape)}) does not split over "
          f"the mesh's batch axes {dict(self.mesh.shape)}; use a per-process batch that divides evenly"
        )
      return jax.make_array_from_process_local_data(sharding, np.asarray(x), tuple(shape))

    return jax.tree_util.tree_map_with_path(put, tree)

  def micro(self, x: np.ndarray, num_micro: int):
    """A host array [B*..., ...] -> a device array [M, B/M*..., ...] sharded on its batch axis."""
    x = np.asarray(x)
    return self.place({"x": x.reshape(num_micro, -1, *x.shape[1:])})["x"]

  def close(self) -> None:
    if self._pool is not None:
      self._pool.shutdown(wait=False)
      self._pool = None


def micro_packs(
  packs, rows_per_micro: int, num_micro: int, cfg, steps: int = DEFAULT_STEPS
) -> tuple[np.ndarray, VisionLayout]:
  """Per micro-batch vision packs from a placed batch's packs (one per process, each `patches` long, laid end to
  end): (index int32 [M, P * L] of each micro-batch pack's patches in the placed pixels, padding pointing at patch
  0; the micro-batches' VisionLayouts stacked [M, ...]). Micro-batch m holds rows [m * b, (m + 1) * b) of every
  process's block, process by process, each process's part padded to L, the bucketed size of the largest."""
  groups = []  # [m][p] -> (grids, patch indexes)
  for m in range(num_micro):
    group = []
    for p, pack in enumerate(packs):
      sizes = np.prod(pack.grid_thw, -1).astype(np.int64)
      starts = p * pack.patches + np.concatenate([[0], np.cumsum(sizes)[:-1]])
      keep = (pack.rows >= m * rows_per_micro) & (pack.rows < (m + 1) * rows_per_micro)
      patches = [np.arange(a, a + n) for a, n in zip(starts[keep], sizes[keep])]
      group.append((pack.grid_thw[keep], np.concatenate(patches) if patches else np.zeros((0,), np.int64)))
    groups.append(group)
  shape = None
  for group in groups:
    need = layout_shape_for([g for g, _ in group], cfg).bucketed(cfg, steps)
    shape = need if shape is None else shape.union(need)
  index = np.zeros((num_micro, len(packs) * shape.patches), np.int32)
  for m, group in enumerate(groups):
    for p, (_, patches) in enumerate(group):
      index[m, p * shape.patches : p * shape.patches + len(patches)] = patches
  layouts = stack_layouts([layout_for([g for g, _ in group], cfg, shape) for group in groups])
  return index, layouts


def micro_major(x: jax.Array, axis: int, processes: int, block: int, real: int, num_micro: int) -> jax.Array:
  """A global batch axis of `processes` blocks of `block` rows (the first `real` of each real) -> a leading
  micro-batch axis: [..., P * block, ...] -> [M, ..., P * real / M, ...], micro-batch m holding block p's
  m-th slice of `real / M` rows for every p in order (as `make_array_from_process_local_data` lays out every
  process's [M, real / M, ...] host batch)."""
  lead, rest = x.shape[:axis], x.shape[axis + 1 :]
  mb = real // num_micro
  x = x.reshape(*lead, processes, block, *rest)
  x = jax.lax.slice_in_dim(x, 0, real, axis=axis + 1)
  x = x.reshape(*lead, processes, num_micro, mb, *rest)
  x = jnp.moveaxis(x, axis + 1, 0)
  return x.reshape(num_micro, *lead, processes * mb, *rest)


@functools.lru_cache(maxsize=32)
def _relayout_fn(specs: tuple, processes: int, num_micro: int, shardings: tuple):
  def fn(*xs):
    return tuple(micro_major(x, a, processes, b, r, num_micro) for x, (a, b, r) in zip(xs, specs))

  return jax.jit(fn, out_shardings=shardings)


@functools.lru_cache(maxsize=32)
def _gather_fn(sharding):
  return jax.jit(lambda pixels, index: pixels[index], out_shardings=sharding)


@functools.lru_cache(maxsize=32)
def _rollout_fn(processes: int, block: int, real: int, num_micro: int, sharding, with_logprobs: bool):
  micro = lambda x: None if x is None else micro_major(x, 0, processes, block, real, num_micro)

  def fn(tokens, lengths, logprobs):
    tokens, lengths, logprobs = micro(tokens), micro(lengths), micro(logprobs)
    return tokens, jnp.arange(tokens.shape[-1]) < lengths[..., None], logprobs

  return jax.jit(fn, out_shardings=(sharding, sharding, sharding if with_logprobs else None))
