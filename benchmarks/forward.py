"""Prefill throughput: jaxcap's jitted Qwen2.5-VL forward vs `transformers` on the same config, batch and CPU.

    python benchmarks/forward.py [--batch 8] [--image 224] [--repeats 5]

Both run float32 with the same random weights (the HF model is saved and loaded into jaxcap). Prints tokens/s
(prompt tokens incl. vision tokens) for each, the ratio, and jaxcap's one-off compile time separately.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--image", type=int, default=224, help="square image side in pixels")
  ap.add_argument("--repeats", type=int, default=5)
  ap.add_argument("--threads", type=int, default=os.cpu_count())
  args = ap.parse_args()

  import jax
  import jax.numpy as jnp
  import torch
  from flax import nnx

  import jaxcap.models as M
  from hf_reference import hf_inputs, image_conversations, paired_models

  torch.set_num_threads(args.threads)
  cfg = M.mid()
  ref, ours, proc = paired_models(cfg)
  n_params = sum(p.numel() for p in ref.parameters())
  rng = np.random.RandomState(0)
  convs = image_conversations(args.batch, args.image, rng)
  batch = proc(convs)
  tokens = int(batch.attention_mask.sum())

  graphdef, params = nnx.split(ours)

  @jax.jit
  def forward(params, ids, pos, mask, vision):
    logits, _ = nnx.merge(graphdef, params)(ids, pos, mask, vision)
    return logits

  jargs = (
    jnp.asarray(batch.input_ids),
    jnp.asarray(batch.positions),
    jnp.asarray(batch.attention_mask),
    jax.tree.map(jnp.asarray, batch.vision()),
  )
  t0 = time.perf_counter()
  forward(params, *jargs).block_until_ready()
  compile_s = time.perf_counter() - t0

  def timed(fn):
    best = float("inf")
    for _ in range(args.repeats):
      t = time.perf_counter()
      fn()
      best = min(best, time.perf_counter() - t)
    return best

  jax_s = timed(lambda: forward(params, *jargs).block_until_ready())
  kw = hf_inputs(batch, cfg)
  kw["position_ids"] = torch.as_tensor(batch.positions, dtype=torch.long)
  with torch.inference_mode():
    ref(**kw)  # warm-up
    hf_s = timed(lambda: ref(**kw))
  print(
    f"config=mid ({n_params / 1e6:.1f}M params) batch={args.batch} image={args.image}px "
    f"prompt_tokens={tokens} (vision {int(np.prod(batch.grid_thw, -1).sum()) // 4}) threads={args.threads}"
  )
  print(f"transformers: {tokens / hf_s:9.0f} tokens/s  ({hf_s * 1e3:.1f} ms)")
  print(f"jaxcap      : {tokens / jax_s:9.0f} tokens/s  ({jax_s * 1e3:.1f} ms; compile {compile_s:.1f} s once)")
  print(f"ratio jaxcap/transformers: {hf_s / jax_s:.2f}x")


if __name__ == "__main__":
  main()
