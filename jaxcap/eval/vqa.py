"""The VQA probe: how well a policy answers the manifest's multiple-choice questions *with* the image, the skill
`sft.vqa_fraction` trains alongside captioning; the knowledge-retention ablation compares it after caption RL
against after more caption-only SFT.

Each question is asked in `jaxcap.processing.vqa`'s format (the one SFT trains). The policy's answer is the option
whose whole answer ("B. red" and the end of the turn) it finds most likely: the summed log-probability of those
tokens after the prompt (lm-eval's multiple-choice "acc"; no sampling; the prompt is embedded once for all its
options). A letter alone (MMLU-style next-token logits) undercounts a policy that names the right option's text
under a wrong letter, which the tiny embedded student does on most questions. Works alike for the tiny embedded
student and a real Qwen2.5-VL checkpoint. Batches are padded to a fixed number of rows, and prompt lengths / vision packs to the
largest bucket seen so far, so a run over same-sized images compiles one program.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxcap.buckets import DEFAULT_STEPS
from jaxcap.data.records import ImageRecord
from jaxcap.eval.metrics import RatioMetric
from jaxcap.models.families import layout_for, layout_shape_for
from jaxcap.models.inference_graph import unrolled_on_cpu
from jaxcap.processing.vqa import letter_token_ids, max_options, option_answer, vqa_prompt
from jaxcap.sampling.prompts import bucket_prompts, pad_length, pad_patches
from jaxcap.sampling.placement import SamplerBatch, place_batch
from jaxcap.processing.tokenizer import encode_targets
from jaxcap.train.steps.logprobs import completion_logprobs


@dataclasses.dataclass(frozen=True)
class VQAAnswers:
  """One row per question asked [Q], in record then question order: image int (index into the records),
  choice int (the option index the policy picked), answer int (the correct option's index), logits float32
  [Q, K] (each option's answer log-likelihood in nats, -inf past the question's options)."""

  image: np.ndarray
  choice: np.ndarray
  answer: np.ndarray
  logits: np.ndarray

  def metric(self, num_images: int) -> RatioMetric:
    """Per image: num = correct answers, den = questions asked (0 for images without questions)."""
    num = np.bincount(self.image, weights=(self.choice == self.answer).astype(float), minlength=num_images)
    den = np.bincount(self.image, minlength=num_images).astype(float)
    return RatioMetric.from_arrays(num, den)


def vqa_scores(model, processor, records: Sequence[ImageRecord], **options) -> RatioMetric:
  """VQA accuracy per image over `records` (`vqa_answers`, same `options`): num = correct answers, den = questions
  asked."""
  return vqa_answers(model, processor, records, **options).metric(len(records))


def vqa_answers(
  model,
  processor,
  records: Sequence[ImageRecord],
  *,
  batch_size: int = 16,
  mesh=None,
  image_size: int = 0,
  pad_to_multiple: int = 16,
  bucket_steps: int = DEFAULT_STEPS,
) -> VQAAnswers:
  """The policy's answer to every question of `records`. `model`: a `Qwen25VL` or its `(graphdef, params)`;
  `processor`: its `Processor` (tokenizer, image settings, system turn: the policy's own). `batch_size` questions
  per forward; `mesh`: run under it (batch-sharded), else on the default device; `image_size`: every image
  resized to that square side (pixels) as training's `data.image_size`, 0 = native size within the processor's
  pixel budget. Single process."""
  if batch_size < 1:
    raise ValueError(f"batch_size={batch_size}: must be >= 1")
  if jax.process_count() > 1:
    raise ValueError("the VQA probe runs in one process; run it from a single-process job")
  graphdef, params = nnx.split(model) if isinstance(model, nnx.Module) else model
  items = [(i, q) for i, r in enumerate(records) for q in r.questions]
  image = np.array([i for i, _ in items], np.int64)
  answer = np.array([q.answer_index for _, q in items], np.int64)
  if not items:
    return VQAAnswers(image, np.zeros((0,), np.int64), answer, np.zeros((0, 0), np.float32))
  k_max = max_options([q for _, q in items])
  letter_token_ids(processor.tokenizer, k_max)  # a clear error for a tokenizer the format does not fit
  cfg = processor.cfg
  pad = getattr(processor.tokenizer, "pad_token_id", None)
  pad_id = int(pad) if pad is not None else int(cfg.eos_token_id)
  answers = [[option_answer(q, min(k, len(q.options) - 1)) for k in range(k_max)] for _, q in items]
  encoded = [len(processor.tokenizer(a, add_special_tokens=False)["input_ids"]) for row in answers for a in row]
  answer_length = -(-(max(encoded) + 1) // 8) * 8  # + the end of the turn; a multiple of 8: few programs
  floats = [x.dtype.itemsize for x in jax.tree.leaves(params) if jnp.issubdtype(x.dtype, jnp.floating)]
  if min(floats, default=4) < 4:  # a bf16 checkpoint: on CPU its stacks held once, not again in float32
    graphdef = unrolled_on_cpu(graphdef, params)
  fn = _option_scores_fn(graphdef)
  media = _MediaCache(processor, image_size)
  length, shape, logits = 0, None, []
  for start in range(0, len(items), batch_size):
    chunk = items[start : start + batch_size]
    real = len(chunk)
    chunk = chunk + [chunk[-1]] * (batch_size - real)  # a short last batch keeps the compiled row count
    convs = [media.conversation(records[i], vqa_prompt(q)) for i, q in chunk]
    inputs = processor(convs, padding_side="left", pad_to_multiple_of=pad_to_multiple)
    prompts, _, vision_items = bucket_prompts(
      inputs, cfg, length_multiple=pad_to_multiple, pad_id=pad_id, steps=bucket_steps
    )
    # padded up to the largest shapes seen so far: shorter prompts / fewer patches reuse the compiled program
    length = max(length, prompts.length)
    prompts = pad_length(prompts, length, pad_id)
    if vision_items is not None:
      need = layout_shape_for(vision_items.grid_thw, cfg.vision).bucketed(cfg.vision, bucket_steps)
      shape = need if shape is None else shape.union(need)
      vision = type(prompts.vision)(
        pad_patches(prompts.vision.pixel_values, shape.patches),
        layout_for(vision_items.grid_thw, cfg.vision, shape),
      )
      prompts = dataclasses.replace(prompts, vision=vision)
      vision_items = dataclasses.replace(vision_items, patches=shape.patches)
    batch = SamplerBatch(prompts, real, prompts.batch, 0, None if vision_items is None else (vision_items,))
    rows = [answers[start + j] if j < real else answers[start + real - 1] for j in range(len(chunk))]
    with _mesh(mesh):
      placed = place_batch(batch, cfg, pad_id, bucket_steps)
      extra = placed.prompts.input_ids.shape[0] - len(rows)  # rows place_batch added (padding)
      flat = [a for row in rows + [rows[-1]] * extra for a in row]
      ids, mask = encode_targets(processor.tokenizer, flat, answer_length, int(cfg.eos_token_id))
      out = fn(params, placed.prompts, ids, mask)
    logits.append(np.asarray(jax.device_get(out)).reshape(-1, k_max)[:real])
  scores = np.concatenate(logits)  # float32 [Q, K]
  options = np.array([len(q.options) for _, q in items])
  scores = np.where(np.arange(scores.shape[1])[None, :] < options[:, None], scores, -np.inf)
  return VQAAnswers(image, scores.argmax(-1).astype(np.int64), answer, scores.astype(np.float32))


def _mesh(mesh):
  import contextlib

  return jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext()


@functools.lru_cache(maxsize=8)
def _option_scores_fn(graphdef):
  """jit((params, Prompts [B, T], answer ids int [B * K, C], mask bool [B * K, C]) -> float32 [B * K]: the summed
  log-probability of each prompt's K answers (rows b * K .. b * K + K - 1 answer prompt b)."""

  def fn(params, prompts, ids, mask):
    model = nnx.merge(graphdef, params)
    lp, _ = completion_logprobs(
      model, prompts.input_ids, prompts.positions, prompts.attention_mask, prompts.vision, ids
    )
    return jnp.sum(jnp.where(mask, lp, 0.0), axis=-1)

  return jax.jit(fn)


class _MediaCache:
  """Each record's media decoded once for all its questions (they come one record after another)."""

  def __init__(self, processor, image_size: int):
    self.processor, self.image_size = processor, image_size
    self._record: Any = None
    self._item: Any = None

  def conversation(self, record: ImageRecord, prompt: str) -> list[dict]:
    """The SFT conversation (`jaxcap.train.rollouts.loader.conversation`): one user turn, the record's media then `prompt`."""
    from jaxcap.train.rollouts import loader as data_lib

    if record is not self._record:
      conv = data_lib.conversation(
        record,
        "",
        self.image_size,
        video_cfg=self.processor.video_cfg,
        max_image_pixels=self.processor.vision_cfg.max_image_pixels,
      )
      self._record, self._item = record, conv[0]["content"][0]
    return [{"role": "user", "content": [self._item, {"type": "text", "text": prompt}]}]
