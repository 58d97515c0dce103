"""Update-step throughput: jaxcap's jitted `sft_step` vs `transformers` forward + backward + AdamW step.

    python -m benchmarks.train_step [--batch 8] [--image 224] [--targets 64] [--pairs 5] [--json train_step.json]

Same `mid()` config and random weights on both sides (the HF model is saved and loaded into jaxcap with
`load_hf_checkpoint`), same batch (`--batch` prompts of one `--image` px image + text, each followed by
`--targets` target tokens), float32, same CPU, one process. One update = forward over prompt + targets, token-mean
NLL of the targets, backward, global-norm clip 1.0 and one AdamW step (lr 1e-5, no weight decay); jaxcap runs it
as one compiled function with the state donated (the trainer's `RunPrograms.update("sft", ...)` of
`jaxcap.train.steps.programs`, from a run config set to those hyper-parameters), transformers as
`loss.backward(); clip_grad_norm_; opt.step()`.

tokens/s counts every token the forward sees (vision + text prompt + targets) per update. The first-step losses
of both are printed as a check that the two compute the same thing. Each side is warmed up first and that time
reported apart (jaxcap: compile, then its first update; transformers: one update, which also allocates AdamW's
moments), then the two are timed interleaved, jaxcap then transformers, --pairs times (benchmarks/harness.py):
min and median per side, the ratio of the mins, the machine and its load.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

if not __package__:  # run as a file (python benchmarks/train_step.py): the repository root, for `benchmarks.*`
  sys.path.append(str(Path(__file__).resolve().parents[1]))

from benchmarks.ceilings import measured_ceilings  # noqa: E402
from benchmarks.fixtures import hf_inputs, image_conversations, paired_models, run_config  # noqa: E402
from benchmarks.harness import Section, add_arguments, interleaved, warm_up  # noqa: E402
from benchmarks.report import report  # noqa: E402


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--batch", type=int, default=8, help="prompts (one image each) per update")
  ap.add_argument("--image", type=int, default=224, help="square image side in pixels")
  ap.add_argument("--targets", type=int, default=64, help="target tokens per prompt")
  ap.add_argument("--repeats", type=int, default=1, help="back-to-back updates per side in each turn (each timed)")
  ap.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads")
  ap.add_argument("--skip_hf", action="store_true", help="time jaxcap only")
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
  from jaxcap.models.vision import vision_layout
  from jaxcap.train.steps.programs import RunPrograms
  from jaxcap.train.steps.state import init_train_state
  from jaxcap.train.steps.updates import PromptBatch

  torch.set_num_threads(args.threads)
  cfg = M.mid()
  ref, ours, proc = paired_models(cfg, scan_layers=args.scanned)
  n_params = sum(p.numel() for p in ref.parameters())
  rng = np.random.RandomState(0)
  convs = image_conversations(args.batch, args.image, rng)
  batch = proc(convs, padding_side="left")
  b, p = batch.input_ids.shape
  c = args.targets
  # Ordinary text tokens (below every special id of mid()), the same for both sides.
  targets = rng.randint(10, 30000, size=(b, c)).astype(np.int32)
  tokens = int(batch.attention_mask.sum()) + b * c
  vision_tokens = int(np.prod(batch.grid_thw, -1).sum()) // cfg.vision.spatial_merge_size**2

  # ------------------------------------------------------------------ jaxcap
  graphdef, params = nnx.split(ours)
  programs = RunPrograms(run_config("sft", lr=1e-5, steps=1000), graphdef)
  optimizer = programs.optimizer("sft")
  state = init_train_state(params, optimizer, jax.random.key(0))
  layout = vision_layout(batch.grid_thw, cfg.vision)
  prompts = PromptBatch(
    jnp.asarray(batch.input_ids)[None],
    jnp.asarray(batch.positions)[None],
    jnp.asarray(batch.attention_mask)[None],
    jnp.asarray(batch.pixel_values)[None],
  )
  tgt = jnp.asarray(targets)[None]
  tmask = jnp.ones_like(tgt, dtype=bool)
  step = programs.update("sft", optimizer, jax.tree.map(lambda x: x.sharding, state))

  t0 = time.perf_counter()
  compiled = step.lower(state, prompts, tgt, tmask, layout).compile()
  compile_s = time.perf_counter() - t0
  losses = {}

  def jax_update():
    nonlocal state
    state, m = compiled(state, prompts, tgt, tmask, layout)
    jax.block_until_ready(m["loss"])
    if "jaxcap" not in losses:  # the warm-up update's loss; later calls skip the transfer
      losses["jaxcap"] = float(m["loss"])

  warmup = {"jaxcap": compile_s + warm_up(jax_update)}

  # ------------------------------------------------------------------ transformers
  hf_update = None
  if not args.skip_hf:
    kw = hf_inputs(batch, cfg)
    tt = torch.as_tensor(targets, dtype=torch.long)
    kw["input_ids"] = torch.cat([kw["input_ids"], tt], 1)
    kw["attention_mask"] = torch.cat([kw["attention_mask"], torch.ones_like(tt)], 1)
    kw["mm_token_type_ids"] = torch.cat([kw["mm_token_type_ids"], torch.zeros_like(tt, dtype=torch.int)], 1)
    kw["labels"] = torch.cat([torch.full((b, p), -100, dtype=torch.long), tt], 1)
    ref.train()
    o = programs.config.sft.optim  # the same AdamW and clip as jaxcap's (constant lr, no warm-up)
    opt = torch.optim.AdamW(ref.parameters(), lr=o.lr, betas=(o.b1, o.b2), eps=o.eps, weight_decay=o.weight_decay)

    def hf_update():
      opt.zero_grad(set_to_none=True)
      loss = ref(**kw).loss
      loss.backward()
      torch.nn.utils.clip_grad_norm_(ref.parameters(), o.grad_clip)
      opt.step()
      if "transformers" not in losses:
        losses["transformers"] = float(loss.detach())

    warmup["transformers"] = warm_up(hf_update)  # same weights and batch as jaxcap's first update

  print(
    f"config=mid ({n_params / 1e6:.1f}M params) batch={b} image={args.image}px tokens/update={tokens} "
    f"(vision {vision_tokens}, prompt {p}/seq, targets {c}/seq) f32 threads={args.threads} "
    f"jax {jax.__version__} torch {torch.__version__}"
  )
  extra = dict(
    params_m=round(n_params / 1e6, 1), tokens_per_update=tokens, vision_tokens=vision_tokens, jaxcap_compile_s=compile_s
  )
  if hf_update is not None:
    print(f"first-step loss: transformers {losses['transformers']:.5f}  jaxcap {losses['jaxcap']:.5f}")
    extra.update(first_step_loss_transformers=losses["transformers"], first_step_loss_jaxcap=losses["jaxcap"])
  from jaxcap.models.flops import model_flops, param_counts

  per_image = int(np.prod(batch.grid_thw[0]))
  # the MFU convention: forward + backward, LM head at the target positions only (the work both sides must do)
  flops = model_flops(
    cfg, param_counts(params), sequences=b, prompt=p, completion=c, images=b, patches_per_image=per_image
  )["total"]
  ceilings = measured_ceilings(args, cfg, tokens, with_torch=not args.skip_hf)
  with Section() as section:
    jax_s, hf_s = interleaved(jax_update, hf_update, args.pairs, args.repeats, names=("jaxcap", "transformers"))
  ceilings = measured_ceilings(args, cfg, tokens, with_torch=not args.skip_hf, previous=ceilings)  # and after
  report(
    "train step (sft update)",
    tokens,
    "tokens/s",
    {"jaxcap": jax_s, "transformers": hf_s},
    warmup,
    section,
    extra=extra,
    args=args,
    json_path=args.json,
    flops_per_call=flops,
    ceilings=ceilings,
  )


if __name__ == "__main__":
  from jaxcap.host_memory import retain_on_cpu

  retain_on_cpu()  # as the launcher does (JAXCAP_HOST_MALLOC=system: glibc defaults)
  main()
