"""SFT's update: prompts + target captions (or VQA answers) -> `sft_step` (padded) or `packed_sft_step`
(`sft.micro_batch_tokens` > 0). `prepare(records)` runs on the loader's thread ahead of its step (numpy only);
`__call__` runs the step and returns its metrics as `PendingMetrics` (device values still in flight)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Sequence

import numpy as np

from jaxcap.data.records import ImageRecord
from jaxcap.data.sft_targets import SFTTarget
from jaxcap.processing.tokenizer import encode_targets
from jaxcap.processing.vqa import letter_token_ids, max_options, vqa_prompt, vqa_target
from jaxcap.train.rollouts.batching import Batcher
from jaxcap.train.logs.metrics import DeviceTimer, PendingMetrics
from jaxcap.train.packing.batch import packed_rows, packing_metrics, with_pixels
from jaxcap.train.steps.batches import HostBatch
from jaxcap.train.learner.vqa import vqa_questions


@dataclasses.dataclass
class SFTUpdate:
  """`update(step_fn, state, batch, rng) -> (state, PendingMetrics)` with `step_fn = jit(sft_step)`.

  With `vqa_fraction` > 0 (default: the run config's `sft.vqa_fraction`), that share of the records with questions
  are VQA examples (`jaxcap.train.learner.vqa`): the prompt is the image + one of the record's questions, lettered, and the
  target its answer (`jaxcap.processing.vqa`); which records and questions is drawn from (`seed`, step, record), so
  `prepare` needs the step (the loader passes each batch's index, which is the step)."""

  batcher: Batcher
  targets: SFTTarget
  tokenizer: Any
  eos_id: int
  micro_batches: int
  max_target_tokens: int
  vqa_fraction: float | None = None  # None: the run config's sft.vqa_fraction
  seed: int | None = None  # of the VQA draws; None: the run config's seed
  micro_batch_tokens: int = 0  # sft.micro_batch_tokens: > 0 packs the step's (prompt, target) sequences
  packing_min_saving: float = 0.1  # sft.packing_min_saving: packed only if that saves this share of FLOPs

  def __post_init__(self):
    config = self.batcher.config
    if self.vqa_fraction is None:
      self.vqa_fraction = float(config.sft.vqa_fraction)
    if self.seed is None:
      self.seed = int(config.seed)
    self._letters_checked = 0  # option count whose letters the tokenizer was checked for

  def prepare(self, records: Sequence[ImageRecord], step: int | None = None) -> HostBatch:
    records, questions, prompts = list(records), None, None
    if self.vqa_fraction:
      if step is None:
        raise ValueError("SFTUpdate.prepare(records, step): with sft.vqa_fraction > 0 the VQA draw needs the step")
      questions = vqa_questions(records, fraction=self.vqa_fraction, seed=self.seed, step=step)
      asked = [q for q in questions if q is not None]
      if max_options(asked) > self._letters_checked:  # fails on the first batch, not in the probe after training
        letter_token_ids(self.tokenizer, max_options(asked))
        self._letters_checked = max_options(asked)
      prompts = [self.batcher.config.data.prompt if q is None else vqa_prompt(q) for q in questions]
    inputs = self.batcher.inputs(records, prompts)
    return HostBatch(records, self.batcher.host_prompts(inputs, self.micro_batches), questions)

  def inputs(self, batch: HostBatch, lengths: np.ndarray, target_len: int):
    """The step's (prompts [M, b, ...] on device, layout, packing/* metrics): padded, the micro-batches' vision
    layouts; packed (micro_batch_tokens > 0), the step's `PackedInputs` of (prompt, target) sequences, `lengths`
    [B] each target's tokens, or the padded layout for a step whose packing does not pay (`packing_pays`)."""
    b, m = self.batcher, self.micro_batches
    if self.micro_batch_tokens <= 0:
      prompts, layout = b.prompts(batch.prompts, m)
      return prompts, layout, {}
    budget = self.micro_batch_tokens
    rows = packed_rows(batch.prompts, lengths, target_len, budget, b.processor.cfg, b.bucket_steps)
    metrics, packed = packing_metrics(
      rows, batch.prompts, lengths, target_len, m, budget, self.packing_min_saving, b.processor.cfg
    )
    placed = b.place_prompts(batch.prompts)
    prompts, layout = b.prompt_batch(placed, m, vision=not packed)
    return prompts, with_pixels(placed, rows) if packed else layout, metrics

  def __call__(
    self,
    step_fn: Callable,
    state,
    batch: HostBatch | Sequence[ImageRecord],
    rng: np.random.Generator,
    step: int | None = None,
  ):
    batch = batch if isinstance(batch, HostBatch) else self.prepare(batch, step)
    m = self.micro_batches
    # every record draws its caption, VQA or not, so the caption rows' targets are those of a run without VQA
    captions = [self.targets(r, rng) for r in batch.records]
    if batch.questions is not None:
      captions = [c if q is None else vqa_target(q) for c, q in zip(captions, batch.questions)]
    ids, mask = encode_targets(self.tokenizer, captions, self.max_target_tokens, self.eos_id)
    prompts, layout, packing = self.inputs(batch, mask.sum(-1), ids.shape[-1])
    dispatched = time.perf_counter()
    state, metrics = step_fn(state, prompts, self.batcher.micro(ids, m), self.batcher.micro(mask, m), layout)
    return state, PendingMetrics(metrics, packing, {"time/update_s": DeviceTimer(dispatched, metrics)})
