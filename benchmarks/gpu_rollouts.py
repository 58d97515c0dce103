"""(b) of `benchmarks.gpu`: tokens/s of `Sampler` rollouts (temperature 1, no stop tokens, so every sequence runs
to --new_tokens), the first call's compile reported apart."""

from __future__ import annotations

import time

import numpy as np

from benchmarks.fixtures import image_batch, run_config


def bench_rollouts(model, args) -> dict:
  import jax

  from jaxcap.sampling import Sampler
  from jaxcap.train.steps.programs import sampling_config

  proc, batch = image_batch(model.cfg, args.rollout_images, args.image, 2)
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
