"""GPU/TPU benchmark of a Qwen2.5-VL-3B-shaped student (random weights, bf16): MFU of the RL update step and
tokens/s of rollouts. A few minutes on one accelerator; prints a JSON summary.

    python -m benchmarks.gpu                      # qwen25vl_3b(), bf16, on jax.devices()[0]
    python -m benchmarks.gpu --peak_tflops 989    # when the device kind is not in the table
    python -m benchmarks.gpu --smoke              # tiny() shapes, runs on CPU in seconds (the test uses this)

(a) Update: the trainer's `rl_step` (`RunPrograms.step_fn("rl", ...)` of `jaxcap.train.programs`, jitted, state
donated) on random prompts + rollouts: --prompts images of --image px with a short instruction, G = --group
completions of --completion tokens each, split into --micro micro-batches (gradient accumulation), AdamW (constant
lr 1e-6, clip 1.0), GRPO with the default clipped loss and no KL, remat as --remat. Timed over --steps steps after
one compile step.

Model FLOPs per update (the PaLM / MFU convention: forward + backward = 3 x forward = 6 x params x tokens, no
credit for remat recomputation; matmuls only, so norms / softmax / rotary are not counted):
  decoder   6 x (decoder-layer params) x (N sequences x (P prompt + C completion) tokens)  [the prompt is run
            once per completion, as `completion_logprobs` does]
          + 12 x layers x (heads x head_dim) x T per token for attention scores and values (T = P + C, counted
            as full, non-causal attention, as PaLM does)
          + 6 x hidden x vocab x (N x C)  for the LM head, applied only at completion positions
  vision    6 x (patch-embed + ViT-block params) x patches + 6 x (merger params) x patches / merge^2
          + 12 x hidden x window x patches per block (window = 64 patches for window blocks, the whole image for
            the full-attention blocks); each image is encoded once per update, not once per completion
MFU = model FLOPs / step time / peak FLOP/s of the device (bf16 dense, table `PEAK_TFLOPS`; --peak_tflops
overrides). One device only.

(b) Rollouts: `Sampler` with temperature 1 (no top-k / top-p) and no stop tokens, so every sequence runs to --new_tokens;
--rollout_images x --rollout_group sequences; tokens/s = generated tokens / wall time of the second call
(prefill and vision included; the first call's compile is reported apart).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

if not __package__:  # run as a file (python benchmarks/gpu.py): the repository root, for `benchmarks.*`
  sys.path.append(str(Path(__file__).resolve().parents[1]))

from benchmarks.fixtures import run_config  # noqa: E402
from jaxcap.models.flops import model_flops, param_counts, peak_tflops  # noqa: E402


def _sig(x: float, digits: int = 4) -> float:
  return float(f"{x:.{digits}g}")


def _inputs(cfg, count: int, image: int, seed: int):
  from jaxcap.processing import Processor, word_tokenizer

  words = "describe the image in detail . a red square on the left".split()
  proc = Processor(word_tokenizer(words, cfg), cfg)
  rng = np.random.RandomState(seed)
  convs = [
    [
      {
        "role": "user",
        "content": [
          {"type": "image", "image": (rng.rand(image, image, 3) * 255).astype(np.uint8)},
          {"type": "text", "text": "describe the image in detail ."},
        ],
      }
    ]
    for _ in range(count)
  ]
  return proc, proc(convs, padding_side="left")


def bench_update(model, args) -> dict:
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from jaxcap.models.vision import vision_layout
  from jaxcap.train.programs import RunPrograms
  from jaxcap.train.state import init_train_state
  from jaxcap.train.step import PromptBatch, RolloutBatch

  cfg = model.cfg
  b, g, m, c = args.prompts, args.group, args.micro, args.completion
  if b % m:
    raise SystemExit(f"--prompts={b} must be divisible by --micro={m}")
  _, batch = _inputs(cfg, b, args.image, 0)
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

  train_cfg = cfg.replace(remat=args.remat)
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
  flops = model_flops(cfg, counts, sequences=b * g, prompt=p, completion=c, images=b, patches_per_image=per_image)
  tokens = b * g * (p + c)
  device = jax.devices()[0]
  peak = args.peak_tflops or peak_tflops(device.device_kind)
  achieved = flops["total"] / step_s / 1e12
  del state
  return {
    "prompts": b,
    "group": g,
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


def bench_rollouts(model, args) -> dict:
  import jax

  from jaxcap.sampling import Sampler
  from jaxcap.train.programs import sampling_config

  proc, batch = _inputs(model.cfg, args.rollout_images, args.image, 2)
  n = args.new_tokens
  sampling = sampling_config(run_config(max_new_tokens=n), stop_ids=())
  sampler = Sampler(model, processor=proc, sampling=sampling)
  t0 = time.perf_counter()
  jax.block_until_ready(sampler(batch, jax.random.key(0), num_samples=args.rollout_group).tokens)
  first_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  out = sampler(batch, jax.random.key(1), num_samples=args.rollout_group)
  jax.block_until_ready(out.tokens)
  wall = time.perf_counter() - t0
  generated = int(np.asarray(out.lengths).sum())
  return {
    "images": args.rollout_images,
    "group": args.rollout_group,
    "sequences": args.rollout_images * args.rollout_group,
    "prompt_tokens": int(batch.input_ids.shape[1]),
    "new_tokens": n,
    "generated_tokens": generated,
    "wall_s": round(wall, 3),
    "compile_s": round(first_s - wall, 2),
    "tokens_per_s": round(generated / wall, 1),
  }


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--smoke", action="store_true", help="tiny() shapes that finish in seconds on a CPU")
  ap.add_argument(
    "--dtype",
    choices=("bfloat16", "float32"),
    default=None,
    help="compute and param dtype (default bfloat16; float32 with --smoke)",
  )
  ap.add_argument("--remat", choices=("none", "full", "dots"), default=None, help="default full (none with --smoke)")
  ap.add_argument("--image", type=int, default=None, help="square image side, px (default 448; 56 with --smoke)")
  ap.add_argument("--prompts", type=int, default=None, help="prompts (images) per update (default 4)")
  ap.add_argument("--group", type=int, default=None, help="G completions per prompt in the update (default 8)")
  ap.add_argument("--micro", type=int, default=None, help="micro-batches per update (default 2)")
  ap.add_argument("--completion", type=int, default=None, help="completion tokens in the update (default 512)")
  ap.add_argument("--steps", type=int, default=None, help="timed update steps (default 5)")
  ap.add_argument("--rollout_images", type=int, default=None, help="images per rollout call (default 8)")
  ap.add_argument("--rollout_group", type=int, default=None, help="samples per image in rollouts (default 8)")
  ap.add_argument("--new_tokens", type=int, default=None, help="tokens generated per sequence (default 512)")
  ap.add_argument("--peak_tflops", type=float, default=None, help="device peak, overrides the PEAK_TFLOPS table")
  ap.add_argument("--skip_update", action="store_true")
  ap.add_argument("--skip_rollouts", action="store_true")
  ap.add_argument("--out", default=None, help="also write the JSON summary here")
  args = ap.parse_args(argv)
  full = dict(
    dtype="bfloat16",
    remat="full",
    image=448,
    prompts=4,
    group=8,
    micro=2,
    completion=512,
    steps=5,
    rollout_images=8,
    rollout_group=8,
    new_tokens=512,
  )
  smoke = dict(
    dtype="float32",
    remat="none",
    image=56,
    prompts=2,
    group=2,
    micro=2,
    completion=8,
    steps=1,
    rollout_images=2,
    rollout_group=2,
    new_tokens=8,
  )
  for k, v in (smoke if args.smoke else full).items():
    if getattr(args, k) is None:
      setattr(args, k, v)

  import jax
  import jax.numpy as jnp
  from flax import nnx

  import jaxcap.models as M

  dtype = jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32
  # Built without remat: the model serves the rollouts (remat only matters for the update's backward pass,
  # which gets its own graph with --remat over the same weights).
  cfg = (M.tiny() if args.smoke else M.qwen25vl_3b()).replace(dtype=dtype, param_dtype=dtype, remat="none")
  device = jax.devices()[0]
  t0 = time.perf_counter()
  with jax.default_device(device):
    model = nnx.jit(lambda: M.Qwen25VL(cfg, rngs=nnx.Rngs(0)))()  # initialised on the device, one program
  init_s = time.perf_counter() - t0
  counts = param_counts(nnx.state(model, nnx.Param))
  summary = {
    "model": "tiny" if args.smoke else "qwen25vl_3b",
    "dtype": args.dtype,
    "remat": args.remat,
    "params": counts,
    "device": device.device_kind,
    "platform": device.platform,
    "devices_used": 1,
    "jax": jax.__version__,
    "init_s": round(init_s, 2),
  }
  if not args.skip_rollouts:  # rollouts first: the update donates (and so frees) the model's params
    summary["rollout"] = bench_rollouts(model, args)
  if not args.skip_update:
    summary["update"] = bench_update(model, args)
  text = json.dumps(summary, indent=2)
  print(text)
  if args.out:
    with open(args.out, "w") as f:
      f.write(text + "\n")
  return summary


if __name__ == "__main__":
  main()
