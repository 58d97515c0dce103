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

from jaxcap.data.records import ImageRecord
from jaxcap.models.vision import vision_layout
from jaxcap.processing import Processor
from jaxcap.sampling.sampler import SampledArrays, SamplerBatch
from jaxcap.sharding import logical_to_spec
from jaxcap.train import data as data_lib
from jaxcap.train.step import PromptBatch

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
    self._layouts: dict = {}

  def inputs(self, records: Sequence[ImageRecord]):
    """The processor's batch (host numpy) of `records`' prompts; their media are decoded on a few threads."""
    d = self.config.data
    load = lambda r: data_lib.conversation(r, d.prompt, d.image_size)
    if self.media_threads > 1 and len(records) > 1:
      if self._pool is None:
        self._pool = ThreadPoolExecutor(self.media_threads, thread_name_prefix="media")
      convs = list(self._pool.map(load, records))
    else:
      convs = [load(r) for r in records]
    with self._processing:
      return self.processor(convs, padding_side="left", pad_to_multiple_of=d.pad_to_multiple)

  def host_prompts(self, inputs, num_micro: int):
    """ModelInputs of B prompts -> (PromptBatch [M, B/M, ...] of host arrays, the grid (t, h, w) its images all
    share or None); numpy only."""
    b = inputs.input_ids.shape[0]
    if b % num_micro:
      raise ValueError(f"batch of {b} prompts does not split into {num_micro} micro-batches")
    mb = b // num_micro
    grid, pixels = None, None
    if inputs.pixel_values is not None:
      per_item = _per_item(inputs.grid_thw)
      pixels = inputs.pixel_values.reshape(num_micro, mb * per_item, -1)
      grid = inputs.grid_thw[0]
    split = lambda x: x.reshape(num_micro, mb, *x.shape[1:])
    pos = inputs.positions.reshape(3, num_micro, mb, -1).transpose(1, 0, 2, 3)
    return PromptBatch(split(inputs.input_ids), pos, split(inputs.attention_mask), pixels), grid

  def prompts(self, inputs, num_micro: int):
    """ModelInputs of B prompts (or `host_prompts` of them) -> (PromptBatch [M, B/M, ...] on device, shared
    VisionLayout of one global micro-batch)."""
    batch, grid = inputs if isinstance(inputs, tuple) else self.host_prompts(inputs, num_micro)
    # The step sees the global micro-batch (every process's images, all of one size).
    layout = None if grid is None else self.layout(grid, batch.ids.shape[1] * jax.process_count())
    return self.place(batch, PROMPT_AXES), layout

  def prompt_batch(self, placed: SamplerBatch, num_micro: int):
    """The update's (PromptBatch [M, B/M, ...], layout) from the sampler's placed batch, on device: the same
    arrays `prompts` would upload (bucket rows dropped, every process's micro-batch m in micro-batch m), and
    the same shardings, with no host round trip."""
    p, rows, block = placed.prompts, placed.rows, placed.block
    if rows % num_micro:
      raise ValueError(f"batch of {rows} prompts does not split into {num_micro} micro-batches")
    procs, mb = p.batch // block, rows // num_micro
    t = p.input_ids.shape[1]
    specs = [(1, block, rows), (0, block, rows), (0, block, rows)]  # positions, ids, mask: (axis, block, real)
    shapes = {"ids": (num_micro, procs * mb, t), "positions": (num_micro, 3, procs * mb, t)}
    shapes["mask"] = shapes["ids"]
    layout, arrays = None, [p.positions, p.input_ids, p.attention_mask]
    if p.vision is not None:
      per_item = _per_item(placed.grid_thw)
      pixels = p.vision.pixel_values
      specs.append((0, pixels.shape[0] // procs, rows * per_item))
      shapes["pixel_values"] = (num_micro, procs * mb * per_item, pixels.shape[1])
      arrays.append(pixels)
      layout = self.layout(placed.grid_thw[0], mb * procs)
    names = ["positions", "ids", "mask", "pixel_values"][: len(arrays)]
    shardings = tuple(self.sharding(PROMPT_AXES[n], shapes[n]) for n in names)
    out = dict(zip(names, _relayout_fn(tuple(specs), procs, num_micro, shardings)(*arrays)))
    return PromptBatch(out["ids"], out["positions"], out["mask"], out.get("pixel_values")), layout

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

  def layout(self, grid, count: int):
    """The VisionLayout of `count` items of one `grid` (t, h, w), computed and uploaded (replicated) once, so
    every step's programs reuse it."""
    key = (tuple(int(v) for v in grid), count)
    if key not in self._layouts:
      layout = vision_layout(np.repeat(np.asarray(grid)[None], count, axis=0), self.processor.cfg.vision)
      replicated = NamedSharding(self.mesh, P())
      self._layouts[key] = jax.tree.map(lambda x: jax.make_array_from_process_local_data(replicated, x), layout)
    return self._layouts[key]

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


def _per_item(grids) -> int:
  """Patches per image of a step whose images all share one size."""
  grids = np.asarray(grids)
  if not (grids == grids[0]).all():
    raise ValueError("all images of a step must share one size; set data.image_size (pixels) to resize them")
  return int(np.prod(grids[0]))


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
def _rollout_fn(processes: int, block: int, real: int, num_micro: int, sharding, with_logprobs: bool):
  micro = lambda x: None if x is None else micro_major(x, 0, processes, block, real, num_micro)

  def fn(tokens, lengths, logprobs):
    tokens, lengths, logprobs = micro(tokens), micro(lengths), micro(logprobs)
    return tokens, jnp.arange(tokens.shape[-1]) < lengths[..., None], logprobs

  return jax.jit(fn, out_shardings=(sharding, sharding, sharding if with_logprobs else None))


def encode_targets(tokenizer, captions: Sequence[str], length: int, eos_id: int) -> tuple[np.ndarray, np.ndarray]:
  """Target token ids int32 [N, length] (each caption + EOS, truncated) and their mask bool [N, length]."""
  ids = np.zeros((len(captions), length), np.int32)
  mask = np.zeros((len(captions), length), bool)
  for i, c in enumerate(captions):
    t = tokenizer(c, add_special_tokens=False)["input_ids"][: length - 1] + [eos_id]
    ids[i, : len(t)] = t
    mask[i, : len(t)] = True
  return ids, mask
