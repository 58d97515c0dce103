"""`Sampler`: captions (or any completions) for a batch of prompts, G samples each, with a compiled rollout.

With several processes (`jax.distributed`) the prompts of all processes form one global batch; the rollout's
arrays stay global on device (`Rollouts.arrays`), and each process copies only its own rows' tokens and lengths
to the host, from its own shards, to decode its captions."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding

from jaxcap.buckets import DEFAULT_STEPS
from jaxcap.models.qwen25vl import Qwen25VL
from jaxcap.processing.prompt import ModelInputs
from jaxcap.sampling.decode_layout import hold_for_decoding
from jaxcap.sampling.distribution import SamplingConfig
from jaxcap.sampling.generate import decode_jit, prefill_jit, static_arguments
from jaxcap.sampling.prompts import Prompts, VisionItems, bucket_prompts, pad_length, pad_patches
from jaxcap.sharding import logical_to_spec


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SampledArrays:
  """What the decode loop produced, as global device arrays in the sampler's row order: every process's block of
  `block * G` rows (its prompts padded to their bucket, G samples each), blocks in the order of the global batch.
  tokens int32 [P * block * G, N]; sample_logprobs / policy_logprobs float32 [P * block * G, N]; lengths int32
  [P * block * G]. Nothing here has been copied to the host."""

  tokens: jax.Array
  sample_logprobs: jax.Array
  policy_logprobs: jax.Array
  lengths: jax.Array


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


class Rollouts:
  """G completions for each of B prompts; row b * G + g is sample g of prompt b. R = B * G, N = max_new_tokens.

  tokens int32 [R, N]: completion ids, pad id after the stop token.
  sample_logprobs float32 [R, N]: log-probs under the distribution sampled from (tempered, top-k/top-p
    filtered; 0 for greedy). policy_logprobs float32 [R, N]: the model's own temperature-1 log-probs of the
    same tokens, the "old policy" term of a PPO / GRPO ratio. Both are 0 where completion_mask is False.
  completion_mask bool [R, N]: emitted tokens, the stop token included. lengths int32 [R]: its row sums.
  prompt_index int32 [R]: which prompt each row samples. text: decoded completions (special tokens skipped),
    or None when the sampler has no tokenizer.

  These are this process's rows: device arrays with one process; with several, host arrays copied from this
  process's own shards (no collective). Each is computed on first use, so a caller that keeps to `arrays` (the
  global device arrays, e.g. the trainer's update) and `text` copies only its rows' tokens and lengths to the
  host, once, after the rollout finished; `host_lengths` are those lengths.
  """

  def __init__(self, arrays: SampledArrays, *, rows: int, num_samples: int, first_row: int, tokenizer, multi: bool):
    self.arrays = arrays
    self.rows, self.num_samples, self.tokenizer, self.multi = rows, num_samples, tokenizer, multi
    lo = first_row * num_samples
    self._local = slice(lo, lo + rows * num_samples)

  def _rows(self, x: jax.Array):
    return _fetch_rows(x, self._local.start, self._local.stop) if self.multi else x[: self._local.stop]

  @functools.cached_property
  def _host(self) -> tuple[np.ndarray, np.ndarray]:
    a, lo, hi = self.arrays, self._local.start, self._local.stop
    if self.multi:
      return _fetch_rows(a.tokens, lo, hi), _fetch_rows(a.lengths, lo, hi)
    return np.asarray(a.tokens)[lo:hi], np.asarray(a.lengths)[lo:hi]

  @functools.cached_property
  def tokens(self):
    return self._host[0] if self.multi else self._rows(self.arrays.tokens)

  @functools.cached_property
  def lengths(self):
    return self._host[1] if self.multi else self._rows(self.arrays.lengths)

  @functools.cached_property
  def sample_logprobs(self):
    return self._rows(self.arrays.sample_logprobs)

  @functools.cached_property
  def policy_logprobs(self):
    return self._rows(self.arrays.policy_logprobs)

  @functools.cached_property
  def completion_mask(self):
    n = self.arrays.tokens.shape[1]
    if self.multi:
      return np.arange(n)[None, :] < self.lengths[:, None]
    return jnp.arange(n)[None, :] < self.lengths[:, None]

  @functools.cached_property
  def prompt_index(self):
    return jnp.repeat(jnp.arange(self.rows, dtype=jnp.int32), self.num_samples)

  @property
  def host_lengths(self) -> np.ndarray:
    """This process's rows' lengths as a host array (the copy `text` decodes from)."""
    return self._host[1]

  @functools.cached_property
  def text(self) -> list[str] | None:
    if self.tokenizer is None:
      return None
    tokens, lengths = self._host
    return self.tokenizer.batch_decode([t[:n] for t, n in zip(tokens, lengths)], skip_special_tokens=True)


class Sampler:
  """Batched sampling from a `Qwen25VL` with a static-shape KV cache.

  Each call pads the prompts to a bucket (batch to a power of two; prompt length, in `length_multiple` steps, and
  the vision pack, images of any sizes, up a ladder of `bucket_steps` sizes per octave), so repeated calls in the
  same bucket with the same G and sampling config reuse one compiled program. Under an
  ambient mesh (`jax.set_mesh`) the batch is sharded over ('data', 'fsdp') and heads over 'tensor'.

  `owns_weights=True` (inference only: the annotator, `from_checkpoint`) holds the model's weights as the decode
  loop reads them (`decode_layout.DecodeWeights`) in place of its own layout, consuming the model's arrays.

  The host side of a call can be split off: `bucket` (numpy only, safe on a loader thread), `place` (one upload),
  then the call on the placed batch, whose arrays the caller may reuse (e.g. the prompts of a policy update).
  """

  def __init__(
    self,
    model: Qwen25VL,
    tokenizer: Any = None,
    *,
    processor: Any = None,
    sampling: SamplingConfig = SamplingConfig(),
    length_multiple: int = 16,
    bucket_steps: int = DEFAULT_STEPS,
    owns_weights: bool = False,
  ):
    self.cfg = model.cfg
    self.graphdef, self.params = nnx.split(model)
    if owns_weights:  # inference only: one copy of the weights, laid out as the decode loop reads them
      self.params = hold_for_decoding(self.params, self.cfg)
    if self.cfg.remat != "none":
      # Sampling has no backward pass, and nnx.remat inside the decode loop cannot trace: use the same params
      # through a graph built without activation checkpointing.
      self.cfg = self.cfg.replace(remat="none")
      self.graphdef = nnx.split(nnx.eval_shape(lambda: Qwen25VL(self.cfg, rngs=nnx.Rngs(0))))[0]
    self.processor = processor
    self.tokenizer = tokenizer if tokenizer is not None else getattr(processor, "tokenizer", None)
    self.sampling = sampling
    self.length_multiple, self.bucket_steps = length_multiple, bucket_steps
    pad = getattr(self.tokenizer, "pad_token_id", None)
    self.pad_id = int(pad) if pad is not None else int(self.cfg.eos_token_id)

  @classmethod
  def from_checkpoint(cls, directory, *, mesh=None, param_dtype=None, **kw) -> "Sampler":
    """A sampler for a local HF Qwen2.5-VL checkpoint (weights, config and tokenizer in `directory`), its weights
    held in `param_dtype` ("float32" / "bfloat16"; default: the checkpoint's own, `checkpoint_dtype`)."""
    from jaxcap.checkpoint import checkpoint_dtype, load_hf_checkpoint
    from jaxcap.processing import Processor

    processor = Processor.from_pretrained(directory)
    model = load_hf_checkpoint(directory, mesh=mesh, param_dtype=checkpoint_dtype(directory, param_dtype))
    return cls(model, processor=processor, **({"owns_weights": True} | kw))

  def bucket(self, prompts: ModelInputs | Sequence[Sequence[dict]]) -> SamplerBatch:
    """Host side only (numpy): a left-padded `ModelInputs` or chat conversations (needs a processor), padded to
    its bucket."""
    if not isinstance(prompts, ModelInputs):
      if self.processor is None:
        raise ValueError(
          "conversations need a processor: build Sampler(model, processor=Processor(...)) or pass a ModelInputs batch"
        )
      prompts = self.processor(prompts, padding_side="left")
    padded, rows, items = bucket_prompts(
      prompts, self.cfg, length_multiple=self.length_multiple, pad_id=self.pad_id, steps=self.bucket_steps
    )
    return SamplerBatch(padded, rows, padded.batch, 0, None if items is None else (items,))

  def place(self, batch: SamplerBatch) -> SamplerBatch:
    """Uploads a bucketed batch under the ambient mesh; with several processes every process's batch becomes its
    block of one global batch (all processes must call it, with batches of the same shapes)."""
    return place_batch(batch, self.cfg, self.pad_id, self.bucket_steps)

  def __call__(
    self,
    prompts: ModelInputs | Sequence[Sequence[dict]] | SamplerBatch,
    key: jax.Array,
    *,
    num_samples: int = 1,
    sampling: SamplingConfig | None = None,
    params: Any = None,
  ) -> Rollouts:
    """Samples `num_samples` completions per prompt. `prompts`: a left-padded `ModelInputs`, chat
    conversations (needs a processor) or a `bucket`-ed / `place`-d batch. `params` (an nnx state of this model)
    overrides the stored weights, e.g. the policy being trained. Returns as soon as the rollout is dispatched."""
    batch = prompts if isinstance(prompts, SamplerBatch) else self.bucket(prompts)
    if num_samples < 1:
      raise ValueError(f"num_samples={num_samples}; ask for at least one sample per prompt")
    sampling = sampling or self.sampling
    batch = self.place(batch)
    static = static_arguments(self.graphdef, sampling, self.cfg.eos_token_id, self.pad_id)
    params = self.params if params is None else params
    state = prefill_jit(params, batch.prompts, key, num_samples=num_samples, **static)
    state = decode_jit(params, state, **static)
    # Only these leave the decode state; the KV cache is dropped with it, on device.
    arrays = SampledArrays(state.tokens, state.sample_logprobs, state.policy_logprobs, state.lengths)
    return Rollouts(
      arrays,
      rows=batch.rows,
      num_samples=num_samples,
      first_row=batch.first_row,
      tokenizer=self.tokenizer,
      multi=jax.process_count() > 1,
    )


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


def _fetch_rows(x: jax.Array, lo: int, hi: int) -> np.ndarray:
  """Rows [lo, hi) of the global array `x` as a host array, copied from this process's addressable shards only
  (each needed element once); no collective, so nothing of other processes' rows moves."""
  out = np.empty((hi - lo, *x.shape[1:]), x.dtype)
  covered = np.zeros(out.shape, bool)
  for shard in x.addressable_shards:
    index = shard.index if shard.index else (slice(None),)
    start, stop, _ = index[0].indices(x.shape[0])
    a, b = max(start, lo), min(stop, hi)
    if a >= b:
      continue
    dst = (slice(a - lo, b - lo), *index[1:])
    if covered[dst].all():
      continue  # a replica of what was copied
    out[dst] = np.asarray(shard.data)[a - start : b - start]
    covered[dst] = True
  if not covered.all():
    raise ValueError(f"rows [{lo}, {hi}) of an array of shape {x.shape} are not all on this process's devices")
  return out


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
