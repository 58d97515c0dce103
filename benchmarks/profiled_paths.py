"""The programs `benchmarks.where_time_goes` profiles, at `mid()` shapes, float32, random weights: each path builds
its compiled program and returns (optimized HLO text or None, a call that runs it once and blocks, model FLOPs per
call or None)."""

from __future__ import annotations

import numpy as np

from benchmarks.fixtures import image_conversations, run_config


def _model(scanned: bool):
  import dataclasses

  from flax import nnx

  import jaxcap.models as M
  from jaxcap.processing import Processor, word_tokenizer

  cfg = dataclasses.replace(M.mid(), scan_layers=scanned)
  model = M.Qwen25VL(cfg, rngs=nnx.Rngs(0))
  processor = Processor(word_tokenizer("describe the image in detail .".split(), cfg), cfg)
  return cfg, model, processor


def _batch(processor, images: int, side: int = 224, padding_side="left"):
  return processor(image_conversations(images, side, np.random.RandomState(0)), padding_side=padding_side)


def _flops(cfg, params, batch, completion: int) -> float:
  """Model FLOPs of an update at this batch (`jaxcap.models.flops`, the benchmarks' convention)."""
  from jaxcap.models.flops import model_flops, param_counts

  b, p = batch.input_ids.shape
  per_image = int(np.prod(batch.grid_thw[0]))
  counts = param_counts(params)
  return model_flops(cfg, counts, sequences=b, prompt=p, completion=completion, images=b, patches_per_image=per_image)[
    "total"
  ]


def update_path(scanned: bool):
  """The sft update of train_step.py: 8 prompts + 64 target tokens each, AdamW, one micro-batch."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from jaxcap.models.vision import vision_layout
  from jaxcap.train.steps.programs import RunPrograms
  from jaxcap.train.steps.state import init_train_state
  from jaxcap.train.steps.updates import PromptBatch

  cfg, model, processor = _model(scanned)
  batch = _batch(processor, 8)
  targets = jnp.asarray(np.random.RandomState(1).randint(10, 30000, size=(1, 8, 64)).astype(np.int32))
  graphdef, params = nnx.split(model)
  programs = RunPrograms(run_config("sft", lr=1e-5, steps=1000), graphdef)
  optimizer = programs.optimizer("sft")
  state = {"s": init_train_state(params, optimizer, jax.random.key(0))}
  prompts = PromptBatch(
    *(jnp.asarray(x)[None] for x in (batch.input_ids, batch.positions, batch.attention_mask)),
    jnp.asarray(batch.pixel_values)[None],
  )
  layout = vision_layout(batch.grid_thw, cfg.vision)
  mask = jnp.ones_like(targets, dtype=bool)
  step = programs.update("sft", optimizer, jax.tree.map(lambda x: x.sharding, state["s"]))
  compiled = step.lower(state["s"], prompts, targets, mask, layout).compile()

  def call():
    state["s"], m = compiled(state["s"], prompts, targets, mask, layout)
    jax.block_until_ready(m["loss"])

  flops = _flops(cfg, params, batch, completion=targets.shape[-1])
  return compiled.as_text(), call, flops


def forward_path(scanned: bool):
  """The prefill forward of forward.py: 8 prompts, logits at every position."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  cfg, model, processor = _model(scanned)
  batch = _batch(processor, 8, padding_side="right")
  graphdef, params = nnx.split(model)

  @jax.jit
  def forward(params, ids, pos, mask, vision):
    return nnx.merge(graphdef, params)(ids, pos, mask, vision)[0]

  args = (
    jnp.asarray(batch.input_ids),
    jnp.asarray(batch.positions),
    jnp.asarray(batch.attention_mask),
    jax.tree.map(jnp.asarray, batch.vision()),
  )
  compiled = forward.lower(params, *args).compile()
  b, p = batch.input_ids.shape
  flops = _flops(cfg, params, batch, completion=0) / 3 + 2 * cfg.text.hidden_size * cfg.text.vocab_size * b * p
  return compiled.as_text(), lambda: compiled(params, *args).block_until_ready(), flops


def decode_path(scanned: bool, images: int = 8, samples: int = 4, new_tokens: int = 64):
  """One rollout call of rollout.py: 8 images x 4 samples x 64 new tokens, temperature 1, no stop tokens."""
  import itertools

  import jax

  from jaxcap.sampling import Sampler
  from jaxcap.train.steps.programs import sampling_config

  cfg, model, processor = _model(scanned)
  batch = _batch(processor, images)
  sampling = sampling_config(run_config(max_new_tokens=new_tokens), stop_ids=())
  sampler = Sampler(model, processor=processor, sampling=sampling)
  keys = itertools.count()
  call = lambda: jax.block_until_ready(sampler(batch, jax.random.key(next(keys)), num_samples=samples).tokens)
  call()  # compiles; the HLO of every program it ran is read from the dump below
  return None, call, None


PATHS = {"update": update_path, "forward": forward_path, "decode": decode_path}
