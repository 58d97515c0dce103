"""(a) of `benchmarks.gpu`: the trainer's RL update step timed on random prompts + rollouts, its model FLOPs and
MFU (the convention is described in `benchmarks/gpu.py`)."""

from __future__ import annotations

import math
import time

import numpy as np

from benchmarks.fixtures import image_batch, run_config
from jaxcap.models.flops import model_flops, param_counts


def _sig(x: float, digits: int = 4) -> float:
  return float(f"{x:.{digits}g}")


def bench_update(model, args) -> dict:
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from jaxcap.models.vision import vision_layout
  from jaxcap.train.steps.programs import RunPrograms
  from jaxcap.train.steps.state import init_train_state
  from jaxcap.train.steps.updates import PromptBatch, RolloutBatch

  cfg = model.cfg
  b, g, m, c = args.prompts, args.group, args.micro, args.completion
  if b % m:
    raise SystemExit(f"--prompts={b} must be divisible by --micro={m}")
  _, batch = image_batch(cfg, b, args.image, 0)
  mb = b // m
  p = batch.input_ids.shape[1]
  per_image = int(np.prod(batch.grid_thw[0]))
  split = lambda x: jnp.asarray(x.reshape(m, mb, *x.shape[1:]))
  prompts = PromptBatch(
    split(batch.input_ids),
    jnp.asarray(batch.positions.reshape(3, m, mb, p).transpose(1, 0, 2, 3)),
    split(batch.attention_mask),
    jnp.asarray(batch.pixel_values.reshape(m, mb * per_image, -1), cfg.dtype),
  )
  layout = vision_layout(batch.grid_thw[:mb], cfg.vision)
  rng = np.random.RandomState(1)
  rollouts = RolloutBatch(
    tokens=jnp.asarray(rng.randint(0, min(cfg.text.vocab_size, 100000) - 16, (m, mb * g, c)), jnp.int32),
    mask=jnp.ones((m, mb * g, c), bool),
    old_logprobs=jnp.asarray(-rng.exponential(2.0, (m, mb * g, c)), jnp.float32),
    rewards=jnp.asarray(rng.rand(m, mb, g, 1), jnp.float32),
    reward_valid=jnp.ones((m, mb, g, 1), bool),
    weights=jnp.ones((1,), jnp.float32),
  )

  # The update uses the same weights under a graph with --remat (the rollouts' model is built without remat).
  import jaxcap.models as M

  shared = not args.repeat_prompt  # each prompt through the decoder once per group (the default)
  train_cfg = cfg.replace(remat=args.remat, share_prompt=shared)
  graphdef = nnx.split(nnx.eval_shape(lambda: M.Qwen25VL(train_cfg, rngs=nnx.Rngs(0))))[0]
  params = nnx.split(model)[1]
  counts = param_counts(params)
  # the loss's Dr.GRPO constant is the completion budget, --completion here
  programs = RunPrograms(run_config("rl", lr=1e-6, steps=1000, max_new_tokens=c), graphdef)
  optimizer = programs.optimizer("rl")
  state = init_train_state(params, optimizer, jax.random.key(0))
  del params
  # the trainer's update, jitted with the state donated (not `programs.update`: its out_shardings commit the
  # state, so the second call, the only timed one under --smoke, would compile again for the committed input)
  step = jax.jit(programs.step_fn("rl", optimizer), donate_argnums=0)
  t0 = time.perf_counter()
  state, metrics = step(state, prompts, rollouts, layout)
  jax.block_until_ready(metrics["loss"])
  first_s = time.perf_counter() - t0
  times = []
  for _ in range(args.steps):
    t0 = time.perf_counter()
    state, metrics = step(state, prompts, rollouts, layout)
    jax.block_until_ready(metrics["loss"])
    times.append(time.perf_counter() - t0)
  step_s = float(np.median(times))
  loss = float(metrics["loss"])
  if not math.isfinite(loss):
    raise SystemExit(f"update step produced a non-finite loss {loss}")
  # the work the pass does: with the prompt shared, B x P + N x C decoder positions (MFU credits no repeated prompt)
  shape = dict(sequences=b * g, prompt=p, completion=c, images=b, patches_per_image=per_image)
  flops = model_flops(cfg, counts, prompts=b if shared and g > 1 else None, **shape)
  tokens = b * g * (p + c)
  peak = args.peak_tflops  # the device's, from `peak_tflops` unless --peak_tflops set it (gpu.main)
  achieved = flops["total"] / step_s / 1e12
  del state
  return {
    "prompts": b,
    "group": g,
    "prompt_shared": shared,
    "micro_batches": m,
    "prompt_tokens": p,
    "vision_tokens_per_image": per_image // cfg.vision.spatial_merge_size**2,
    "completion_tokens": c,
    "tokens_per_step": tokens,
    "compile_s": round(first_s - step_s, 2),
    "step_s": round(step_s, 4),
    "tokens_per_s": round(tokens / step_s, 1),
    "model_tflop_per_step": _sig(flops["total"] / 1e12),
    "model_tflop_split": {k: _sig(v / 1e12) for k, v in flops.items() if k != "total"},
    "achieved_tflops": _sig(achieved),
    "peak_tflops": peak,
    "mfu": None if not peak else round(achieved / peak, 4),
    "loss": loss,
  }
