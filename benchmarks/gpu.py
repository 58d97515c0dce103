"""GPU/TPU benchmark of a Qwen2.5-VL-3B-shaped student (random weights, bf16): MFU of the RL update step and
tokens/s of rollouts. A few minutes on one accelerator; prints a JSON summary.

    python -m benchmarks.gpu                      # qwen25vl_3b(), bf16, on jax.devices()[0]
    python -m benchmarks.gpu --peak_tflops 989    # when the device kind is not in the table
    python -m benchmarks.gpu --smoke              # tiny() shapes, runs on CPU in seconds (the test uses this)

(a) Update: the trainer's `rl_step` (`RunPrograms.step_fn("rl", ...)` of `jaxcap.train.steps.programs`, jitted, state
donated) on random prompts + rollouts: --prompts images of --image px with a short instruction, G = --group
completions of --completion tokens each, split into --micro micro-batches (gradient accumulation), AdamW (constant
lr 1e-6, clip 1.0), GRPO with the default clipped loss and no KL, remat as --remat. Timed over --steps steps after
one compile step.

Model FLOPs per update (the PaLM / MFU convention: forward + backward = 3 x forward = 6 x params x tokens, no
credit for remat recomputation; matmuls only, so norms / softmax / rotary are not counted):
  decoder   6 x (decoder-layer params) x (B x P + N x C) tokens: each prompt runs once for its G completions
            (`model.share_prompt`; with --repeat_prompt, N x (P + C): once per completion)
          + 12 x layers x (heads x head_dim) x the (query, key) pairs: B x P x P + N x C x (P + C) (repeated:
            N x (P + C)^2), counted as full, non-causal attention, as PaLM does
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
import sys
import time
from pathlib import Path

if not __package__:  # run as a file (python benchmarks/gpu.py): the repository root, for `benchmarks.*`
  sys.path.append(str(Path(__file__).resolve().parents[1]))

from benchmarks.gpu_rollouts import bench_rollouts  # noqa: E402
from benchmarks.gpu_update import bench_update  # noqa: E402
from jaxcap.models.flops import param_counts, peak_tflops  # noqa: E402


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
  ap.add_argument(
    "--repeat_prompt",
    action="store_true",
    help="the update repeats each prompt per completion (model.share_prompt off)",
  )
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
  if args.peak_tflops is None:  # bench_update's MFU: the table's bf16 dense peak for this device kind
    args.peak_tflops = peak_tflops(device.device_kind)
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
