"""Prefill throughput: jaxcap's jitted Qwen2.5-VL forward vs `transformers` on the same config, batch and CPU.

    python -m benchmarks.forward [--batch 8] [--image 224] [--pairs 5] [--json forward.json]

Both run float32 with the same random weights (the HF model is saved and loaded into jaxcap). After one warm-up
call each (jaxcap's compiles; reported apart), the two forwards are timed interleaved, jaxcap then transformers,
--pairs times (benchmarks/harness.py). Prints tokens/s (prompt tokens incl. vision tokens) at the min and median
call time of each, the ratio of the mins, and the machine and its load.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

if not __package__:  # run as a file (python benchmarks/forward.py): the repository root, for `benchmarks.*`
  sys.path.append(str(Path(__file__).resolve().parents[1]))

from benchmarks.ceilings import measured_ceilings  # noqa: E402
from benchmarks.harness import Section, add_arguments, interleaved, warm_up  # noqa: E402
from benchmarks.report import report  # noqa: E402


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--image", type=int, default=224, help="square image side in pixels")
  ap.add_argument("--repeats", type=int, default=1, help="back-to-back calls per side in each turn (each timed)")
  ap.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads")
  # the main job's CPU setting (configs' model.scan_layers=False); --scanned: the real checkpoints' lax.scan stacks,
  # which on XLA:CPU copy each layer's weights and saved activations in and out of the stacks (see README)
  ap.add_argument("--scanned", action="store_true", help="jaxcap with model scan_layers=True")
  add_arguments(ap)
  args = ap.parse_args()

  import jax
  import jax.numpy as jnp
  import torch
  from flax import nnx

  import jaxcap.models as M
  from benchmarks.fixtures import hf_inputs, image_conversations, paired_models

  torch.set_num_threads(args.threads)
  cfg = M.mid()
  ref, ours, proc = paired_models(cfg, scan_layers=args.scanned)
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
  kw = hf_inputs(batch, cfg)
  kw["position_ids"] = torch.as_tensor(batch.positions, dtype=torch.long)

  def jax_forward():
    forward(params, *jargs).block_until_ready()

  def hf_forward():
    with torch.inference_mode():
      ref(**kw)

  vision_tokens = int(np.prod(batch.grid_thw, -1).sum()) // cfg.vision.spatial_merge_size**2
  from jaxcap.models.flops import model_flops, param_counts

  b, p = batch.input_ids.shape
  per_image = int(np.prod(batch.grid_thw[0]))
  fwd = model_flops(
    cfg, param_counts(params), sequences=b, prompt=p, completion=0, images=b, patches_per_image=per_image
  )
  flops = fwd["total"] / 3 + 2 * cfg.text.hidden_size * cfg.text.vocab_size * b * p  # both sides: logits everywhere
  ceilings = measured_ceilings(args, cfg, tokens)
  print(
    f"config=mid ({n_params / 1e6:.1f}M params) batch={args.batch} image={args.image}px "
    f"prompt_tokens={tokens} (vision {vision_tokens}) threads={args.threads}"
  )
  warmup = {"jaxcap": warm_up(jax_forward), "transformers": warm_up(hf_forward)}  # jaxcap's compiles
  with Section() as section:
    jax_s, hf_s = interleaved(jax_forward, hf_forward, args.pairs, args.repeats, names=("jaxcap", "transformers"))
  ceilings = measured_ceilings(args, cfg, tokens, previous=ceilings)  # and after: the best of both
  report(
    "forward (prefill)",
    tokens,
    "tokens/s",
    {"jaxcap": jax_s, "transformers": hf_s},
    warmup,
    section,
    extra=dict(params_m=round(n_params / 1e6, 1), prompt_tokens=tokens, vision_tokens=vision_tokens),
    args=args,
    json_path=args.json,
    flops_per_call=flops,
    ceilings=ceilings,
  )


if __name__ == "__main__":
  from jaxcap.host_memory import retain_on_cpu

  retain_on_cpu()  # as the launcher does (JAXCAP_HOST_MALLOC=system: glibc defaults)
  main()
