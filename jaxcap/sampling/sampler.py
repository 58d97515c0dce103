"""`Sampler`: captions (or any completions) for a batch of prompts, G samples each, with a compiled rollout.

With several processes (`jax.distributed`) the prompts of all processes form one global batch; the rollout's
arrays stay global on device (`Rollouts.arrays`), and each process copies only its own rows' tokens and lengths
to the host, from its own shards, to decode its captions."""

from __future__ import annotations

from typing import Any, Sequence

import jax
from flax import nnx

from jaxcap.buckets import DEFAULT_STEPS
from jaxcap.models import row_blocks
from jaxcap.models.qwen25vl import Qwen25VL
from jaxcap.models.inference_graph import unrolled_on_cpu, without_remat
from jaxcap.processing.model_inputs import ModelInputs
from jaxcap.sampling.decode_layout import hold_for_decoding
from jaxcap.sampling.distribution import SamplingConfig
from jaxcap.sampling.generate import decode_jit, prefill_jit, static_arguments
from jaxcap.sampling.placement import SamplerBatch, place_batch
from jaxcap.sampling.prompts import bucket_prompts
from jaxcap.sampling.rollouts import Rollouts, SampledArrays


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

  # what a call takes and offers (the paged engine, jaxcap.sampling.engine.PagedSampler, says yes to both)
  wants_host_batch = False  # calls take the host `SamplerBatch` of `bucket` (else the placed one of `place`)
  streams_groups = False  # calls take `on_group`: each prompt's G samples handed over as soon as they are done

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
    if self.cfg.scan_layers and row_blocks.on_cpu():  # stacks held once, at their dtype: `unrolled_on_cpu`
      self.graphdef = unrolled_on_cpu(self.graphdef, self.params)
      self.cfg = self.cfg.replace(scan_layers=False)
    if self.cfg.remat != "none":  # no backward pass to checkpoint for, and nnx.remat cannot trace in the loop
      self.graphdef = without_remat(self.graphdef, self.params)
      self.cfg = self.cfg.replace(remat="none")
    if owns_weights:  # inference only: one copy of the weights, laid out as the decode loop reads them
      self.params = hold_for_decoding(self.params, self.cfg)
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
    owns = kw.pop("owns_weights", True)
    dtype = checkpoint_dtype(directory, param_dtype)
    model = load_hf_checkpoint(directory, mesh=mesh, param_dtype=dtype, layers_apart=owns)
    return cls(model, processor=processor, owns_weights=owns, **kw)

  def bucket(self, prompts: ModelInputs | Sequence[Sequence[dict]], rows_multiple: int = 1) -> SamplerBatch:
    """Host side only (numpy): a left-padded `ModelInputs` or chat conversations (needs a processor), padded to
    its bucket (rows: a power of two, then a multiple of `rows_multiple`)."""
    if not isinstance(prompts, ModelInputs):
      if self.processor is None:
        raise ValueError(
          "conversations need a processor: build Sampler(model, processor=Processor(...)) or pass a ModelInputs batch"
        )
      prompts = self.processor(prompts, padding_side="left")
    padded, rows, items = bucket_prompts(
      prompts,
      self.cfg,
      length_multiple=self.length_multiple,
      pad_id=self.pad_id,
      steps=self.bucket_steps,
      rows_multiple=rows_multiple,
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
