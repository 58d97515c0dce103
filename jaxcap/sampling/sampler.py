"""`Sampler`: captions (or any completions) for a batch of prompts, G samples each, with a compiled rollout."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding

from jaxcap.models.qwen25vl import Qwen25VL
from jaxcap.processing.prompt import ModelInputs
from jaxcap.sampling.distribution import SamplingConfig
from jaxcap.sampling.generate import decode_jit, prefill_jit
from jaxcap.sampling.prompts import Prompts, bucket_prompts
from jaxcap.sharding import logical_to_spec


@dataclasses.dataclass
class Rollouts:
  """G completions for each of B prompts; row b * G + g is sample g of prompt b. R = B * G, N = max_new_tokens.

  tokens int32 [R, N]: completion ids, pad id after the stop token.
  sample_logprobs float32 [R, N]: log-probs under the distribution sampled from (tempered, top-k/top-p
    filtered; 0 for greedy). policy_logprobs float32 [R, N]: the model's own temperature-1 log-probs of the
    same tokens, the "old policy" term of a PPO / GRPO ratio. Both are 0 where completion_mask is False.
  completion_mask bool [R, N]: emitted tokens, the stop token included. lengths int32 [R]: its row sums.
  prompt_index int32 [R]: which prompt each row samples. text: decoded completions (special tokens skipped),
    or None when the sampler has no tokenizer.
  """

  tokens: jax.Array
  sample_logprobs: jax.Array
  policy_logprobs: jax.Array
  completion_mask: jax.Array
  lengths: jax.Array
  prompt_index: jax.Array
  text: list[str] | None


class Sampler:
  """Batched sampling from a `Qwen25VL` with a static-shape KV cache.

  Each call pads the prompts to a bucket (batch to a power of two, prompt length to `length_multiple`), so
  repeated calls with the same bucket, vision shapes, G and sampling config reuse one compiled program. Under an
  ambient mesh (`jax.set_mesh`) the batch is sharded over ('data', 'fsdp') and heads over 'tensor'.
  """

  def __init__(
    self,
    model: Qwen25VL,
    tokenizer: Any = None,
    *,
    processor: Any = None,
    sampling: SamplingConfig = SamplingConfig(),
    length_multiple: int = 16,
  ):
    self.cfg = model.cfg
    self.graphdef, self.params = nnx.split(model)
    if self.cfg.remat != "none":
      # Sampling has no backward pass, and nnx.remat inside the decode loop cannot trace: use the same params
      # through a graph built without activation checkpointing.
      self.cfg = self.cfg.replace(remat="none")
      self.graphdef = nnx.split(nnx.eval_shape(lambda: Qwen25VL(self.cfg, rngs=nnx.Rngs(0))))[0]
    self.processor = processor
    self.tokenizer = tokenizer if tokenizer is not None else getattr(processor, "tokenizer", None)
    self.sampling = sampling
    self.length_multiple = length_multiple
    pad = getattr(self.tokenizer, "pad_token_id", None)
    self.pad_id = int(pad) if pad is not None else int(self.cfg.eos_token_id)

  @classmethod
  def from_checkpoint(cls, directory, *, mesh=None, **kw) -> "Sampler":
    """A sampler for a local HF Qwen2.5-VL checkpoint (weights, config and tokenizer in `directory`)."""
    from jaxcap.checkpoint import load_hf_checkpoint
    from jaxcap.processing import Processor

    processor = Processor.from_pretrained(directory)
    return cls(load_hf_checkpoint(directory, mesh=mesh), processor=processor, **kw)

  def __call__(
    self,
    prompts: ModelInputs | Sequence[Sequence[dict]],
    key: jax.Array,
    *,
    num_samples: int = 1,
    sampling: SamplingConfig | None = None,
    params: Any = None,
  ) -> Rollouts:
    """Samples `num_samples` completions per prompt. `prompts`: a left-padded `ModelInputs` or chat
    conversations (needs a processor). `params` (an nnx state of this model) overrides the stored weights,
    e.g. the policy being trained."""
    if not isinstance(prompts, ModelInputs):
      if self.processor is None:
        raise ValueError(
          "conversations need a processor: build Sampler(model, processor=Processor(...)) or pass a ModelInputs batch"
        )
      prompts = self.processor(prompts, padding_side="left")
    if num_samples < 1:
      raise ValueError(f"num_samples={num_samples}; ask for at least one sample per prompt")
    sampling = sampling or self.sampling
    padded, rows = bucket_prompts(prompts, self.cfg, length_multiple=self.length_multiple, pad_id=self.pad_id)
    static = dict(
      graphdef=self.graphdef,
      sampling=sampling,
      pad_id=self.pad_id,
      stop_ids=sampling.resolve_stop_ids(self.cfg.eos_token_id),
    )
    multi = jax.process_count() > 1
    state = prefill_jit(
      self.params if params is None else params,
      _to_global(padded, self.cfg) if multi else _to_device(padded),
      key,
      num_samples=num_samples,
      **static,
    )
    state = decode_jit(self.params if params is None else params, state, **static)
    real = rows * num_samples
    if multi:  # this process's rows of the global batch, as host arrays
      state = _local_rows(state, padded.batch * num_samples)
    tokens, lengths = state.tokens[:real], state.lengths[:real]
    mask = jnp.arange(sampling.max_new_tokens)[None, :] < lengths[:, None]
    text = None
    if self.tokenizer is not None:
      host_tokens, host_lengths = np.asarray(tokens), np.asarray(lengths)
      text = self.tokenizer.batch_decode([t[:n] for t, n in zip(host_tokens, host_lengths)], skip_special_tokens=True)
    return Rollouts(
      tokens=tokens,
      sample_logprobs=state.sample_logprobs[:real],
      policy_logprobs=state.policy_logprobs[:real],
      completion_mask=mask,
      lengths=lengths,
      prompt_index=jnp.repeat(jnp.arange(rows, dtype=jnp.int32), num_samples),
      text=text,
    )


def _to_global(prompts: Prompts, cfg) -> Prompts:
  """Multi-process: every process's host batch becomes its slice of one global batch (process order).

  Every process must hold the same number of prompts with images of the same sizes (as the trainer's fixed
  image size and per-process batch give), so the global vision layout is the local one repeated."""
  from jaxcap.models.vision import vision_layout

  mesh = jax.sharding.get_mesh()
  if mesh is None or mesh.empty:
    raise ValueError("multi-process sampling needs an ambient mesh: call it under `with jax.set_mesh(mesh):`")
  n = jax.process_count()

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
    local_grids = np.asarray(vision.layout.grid_thw)
    vision = type(vision)(
      place(vision.pixel_values, ("batch", None)), vision_layout(np.concatenate([local_grids] * n), cfg.vision)
    )
  return Prompts(
    place(prompts.input_ids, ("batch", None)),
    place(prompts.attention_mask, ("batch", None)),
    place(prompts.positions, (None, "batch", None)),
    place(prompts.rope_deltas, ("batch",)),
    vision,
  )


def _local_rows(state, rows_per_process: int):
  """Host copies of this process's block of rows of every batch-major array in `state`."""
  from jax.experimental import multihost_utils

  lo = jax.process_index() * rows_per_process

  def local(x):
    if not isinstance(x, jax.Array) or x.ndim == 0:
      return x
    full = np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return full[lo : lo + rows_per_process] if full.shape[0] == rows_per_process * jax.process_count() else full

  return jax.tree.map(local, state)


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
