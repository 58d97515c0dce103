"""Packed vs padded RL passes: the old-log-prob pass and the update step on packed rows (`rl.micro_batch_tokens`)
against the padded rows of today's path, at dense-caption lengths and mixed image sizes.

    OMP_WAIT_POLICY=PASSIVE python -m benchmarks.packed_update [--prompts 4 --samples 4 --median 200 --sigma 0.5
        --cap 1024 --sides 112,168,224 --micro 1 --budget 0 --block 32 --vs_dense --pairs 3
        --cases long-tailed,uniform]

`mid()` model (~60M params, random init), float32, CPU, one process. `--prompts` prompts of one image each, the
sides cycling through `--sides` (square, pixels), `--samples` completions each, random tokens. Completion lengths
as `benchmarks/rollout_lengths.py` forces them: 'long-tailed' draws a lognormal (median --median, shape --sigma,
clipped to [1, --cap]); 'uniform' gives every completion the draws' mean (the same total). The padded side's
completion width is the longest length rounded up to 8 (kinder to it than the trainer's rollout arrays, which are
sampling.max_new_tokens wide), its prompts the bucketed prompt length, in `--micro` micro-batches. The packed side
packs the same step under a budget of `--budget` tokens per micro-batch (0: the padded micro-batch's slots, so
both hold the same tokens at once); its attention runs in query blocks of `--block` slots over a key window
holding the longest sequence (`jaxcap.models.segment_attention`; 0: dense over the row, as before the window);
`--vs_dense` also times it against the same rows with dense attention, interleaved. Both sides' programs come from
`RunPrograms` (`jaxcap.train.steps.programs`) of one run config differing only in rl.micro_batch_tokens; the inputs from
the trainer's `Batcher` and `packed_inputs`. As in the trainer, the packed run's step runs its padded layout when
packing saves less than `rl.packing_min_saving` of the padded pass's decoder FLOPs (`packing_metrics`; `--min_saving -1`: always
the packed rows); the host time of packing the step and choosing is printed (the trainer pays it every step).

Real tokens = each sequence's real prompt tokens + its completion's tokens (a prompt counts once per completion, as
both sides' decoders see it). tokens/s = real tokens / wall time of one call; the padding share is the share of
the decoder's token slots holding none (padded: N x (P + C); packed: rows x row length). Each side is warmed up
(compiled) and that time reported apart; then packed and padded run interleaved, --pairs pairs per pass and case
(benchmarks/harness.py): min and median, ratio of mins, CPU model and load average; and this process's CPU seconds
per call (all its threads; on a shared machine less moved by other work than the wall time, though not immune).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

if not __package__:  # run as a file: the repository root, for `benchmarks.*`
  sys.path.append(str(Path(__file__).resolve().parents[1]))

from benchmarks.fixtures import WORDS, run_config, sized_conversations  # noqa: E402
from benchmarks.harness import Section, add_arguments, cpu_timed, interleaved, warm_up  # noqa: E402
from benchmarks.report import report  # noqa: E402
from benchmarks.rollout_lengths import stop_schedule  # noqa: E402


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--prompts", type=int, default=4)
  ap.add_argument("--samples", type=int, default=4, help="completions per prompt (G)")
  ap.add_argument("--median", type=float, default=200, help="median completion length (tokens), long-tailed case")
  ap.add_argument("--sigma", type=float, default=0.5, help="lognormal shape of the long-tailed lengths")
  ap.add_argument("--cap", type=int, default=1024, help="the longest completion (sampling.max_new_tokens)")
  ap.add_argument("--sides", default="112,168,224", help="image sides (pixels), cycled over the prompts")
  ap.add_argument("--micro", type=int, default=1, help="padded micro-batches (rl.micro_batches)")
  ap.add_argument("--budget", type=int, default=0, help="packed tokens per micro-batch (0: the padded one's slots)")
  ap.add_argument("--cases", default="long-tailed,uniform")
  ap.add_argument(
    "--min_saving",
    type=float,
    default=None,
    help="rl.packing_min_saving of the packed run (default: the config's): a step whose packing saves less of the "
    "padded pass's decoder FLOPs runs the padded programs, as the trainer does; -1: always the packed rows",
  )
  ap.add_argument(
    "--vs_dense",
    action="store_true",
    help="also time the packed side against the same rows with dense attention over the row, interleaved",
  )
  ap.add_argument(
    "--block",
    type=int,
    default=None,
    help="query block (slots) of the packed side's attention window (default: segment_attention.BLOCK; 0: dense "
    "attention over the whole row, as before the window)",
  )
  ap.add_argument("--passes", default="logprobs,update")
  add_arguments(ap)
  args = ap.parse_args()

  import jax
  import jax.numpy as jnp
  from flax import nnx

  import jaxcap.models as M
  from jaxcap.models import segment_attention
  from jaxcap.processing import Processor, word_tokenizer
  from jaxcap.sampling.sampler import place_batch
  from jaxcap.sharding import make_mesh
  from jaxcap.train.rollouts.batching import Batcher
  from jaxcap.train.packing.batch import packed_inputs, packing_metrics
  from jaxcap.train.steps.programs import RunPrograms
  from jaxcap.train.steps.state import init_train_state
  from jaxcap.train.steps.updates import RolloutBatch

  if args.block is not None:  # the packer's choice of window (`packing.pack` reads it)
    segment_attention.BLOCK = args.block or 1 << 30
  rng = np.random.RandomState(0)
  cfg = M.mid()
  graphdef, params = nnx.split(M.Qwen25VL(cfg, rngs=nnx.Rngs(0)))
  proc = Processor(word_tokenizer(WORDS, cfg), cfg)
  mesh = make_mesh({"fsdp": 1}, devices=jax.devices()[:1])
  g, m = args.samples, args.micro
  n = args.prompts * g
  config = run_config("rl", max_new_tokens=args.cap)
  config.rl.update(dict(batch_size=args.prompts, num_samples=g, micro_batches=m))
  batcher = Batcher(proc, config, mesh, media_threads=1)
  sides = [int(s) for s in args.sides.split(",")]
  inputs = proc(sized_conversations([sides[i % len(sides)] for i in range(args.prompts)], rng), padding_side="left")
  host = batcher.host_prompts(inputs, m)
  placed = place_batch(host, cfg, batcher.pad_id, batcher.bucket_steps)
  prompts_padded, layout = batcher.prompt_batch(placed, m)
  prompts_packed, _ = batcher.prompt_batch(placed, m, vision=False)
  prompt_real = np.asarray(host.prompts.attention_mask)[: host.rows].sum(1)
  p_len = host.prompts.input_ids.shape[1]
  print(
    f"mid model, {args.prompts} prompts x {g} samples, images {sides} px: prompts of "
    f"{prompt_real.min()}..{prompt_real.max()} real tokens, padded to {p_len}"
  )

  results = {}
  for case in args.cases.split(","):
    lengths = stop_schedule(n, args.median, args.sigma, args.cap)[case]
    width = int(-(-lengths.max() // 8) * 8)
    budget = args.budget or (n // m) * (p_len + width)
    c = config.copy_and_resolve_references()
    c.rl.micro_batch_tokens = budget
    if args.min_saving is not None:
      c.rl.packing_min_saving = args.min_saving
    programs = {"padded": RunPrograms(config, graphdef), "packed": RunPrograms(c, graphdef)}
    t0 = time.perf_counter()
    packed = packed_inputs(host, placed, lengths, width, budget, cfg, batcher.bucket_steps)
    rows = packed.rows
    # the trainer's choice for this step (RLLearner.inputs): its packed rows, or its padded layout if packing saves
    # less than rl.packing_min_saving of the padded pass's decoder FLOPs
    metrics, pays = packing_metrics(rows, host, lengths, width, m, budget, c.rl.packing_min_saving, cfg)
    host_ms = 1e3 * (time.perf_counter() - t0)
    real = int(np.repeat(prompt_real, g).sum() + lengths.sum())
    share = {"padded": 1 - real / (n * (p_len + width)), "packed": rows.padding_share()}
    print(
      f"\n== {case}: completions {lengths.min()}..{lengths.max()} tokens (mean {lengths.mean():.0f}), padded width "
      f"{width}; packed: {rows.shape[0]} micro-batches x {rows.shape[1]} rows x {rows.shape[2]} tokens (budget "
      f"{budget}), attention {_window(rows.window)}; padding share padded {share['padded']:.3f}, packed rows "
      f"{share['packed']:.3f}; packing saves {1 - rows.source.size / (n * (p_len + width)):.1%} of the padded "
      f"slots, {metrics['packing/saving']:.1%} of its decoder FLOPs: with rl.packing_min_saving="
      f"{c.rl.packing_min_saving} the packed run's step runs "
      f"{'packed' if pays else 'padded'} (host: packing and the choice {host_ms:.1f} ms)"
    )
    share["packed"] = metrics["packing/padding_share"]
    tokens = jnp.asarray(rng.randint(0, cfg.text.vocab_size, (m, n // m, width)).astype(np.int32))
    cmask = jnp.asarray((np.arange(width)[None] < lengths[:, None]).reshape(m, n // m, width))
    sides = {
      "packed": (programs["packed"], *((prompts_packed, packed) if pays else (prompts_padded, layout))),
      "padded": (programs["padded"], prompts_padded, layout),
    }
    if args.vs_dense and pays and rows.window is not None:  # the same rows, attention dense over the row
      dense = dataclasses.replace(packed, rows=dataclasses.replace(rows, window=None))
      sides["packed-dense"] = (programs["packed"], prompts_packed, dense)
    old = {name: prog.logprobs()(params, prompts, v, tokens) for name, (prog, prompts, v) in sides.items()}
    for name in [k for k in sides if k != "padded"]:
      diff = float(jnp.max(jnp.abs(jnp.where(cmask, old[name] - old["padded"], 0.0))))
      print(f"old log-probs, {name} vs padded: max |diff| {diff:.2e} over the completion tokens")
    rewards = jnp.asarray(rng.randn(m, args.prompts // m, g, 1).astype(np.float32))
    batch = RolloutBatch(tokens, cmask, old["padded"], rewards, jnp.ones(rewards.shape, bool), jnp.ones((1,)))

    for which in args.passes.split(","):
      calls, states = {}, {}
      for name, (prog, prompts, v) in sides.items():
        if which == "logprobs":
          fn = prog.logprobs()
          calls[name] = lambda fn=fn, p=prompts, v=v: fn(params, p, v, tokens).block_until_ready()
        else:
          opt = prog.optimizer("rl")
          states[name] = init_train_state(jax.tree.map(jnp.copy, params), opt, jax.random.key(0))
          step = prog.update("rl", opt, jax.tree.map(lambda x: x.sharding, states[name]))

          def call(name=name, step=step, p=prompts, v=v):
            states[name], metrics = step(states[name], p, batch, v)
            jax.block_until_ready(metrics["loss"])

          calls[name] = call
      cpu = {name: [] for name in calls}  # this process's CPU seconds per call (all threads): less moved by load
      calls = {name: cpu_timed(fn, cpu[name]) for name, fn in calls.items()}
      warm = {name: warm_up(fn) for name, fn in calls.items()}
      for times in cpu.values():
        times.clear()
      print(f"-- {which} ({case}): warm-up (compile) " + ", ".join(f"{k} {v:.1f} s" for k, v in warm.items()))
      for other in [k for k in sides if k != "packed"]:
        with Section() as section:
          t_packed, t_other = interleaved(calls["packed"], calls[other], args.pairs, names=("packed", other))
        print(
          "CPU s per call (min / median): "
          + ", ".join(f"{k} {min(cpu[k]):.3f} / {np.median(cpu[k]):.3f}" for k in ("packed", other))
          + f"; ratio of mins {min(cpu[other]) / min(cpu['packed']):.2f}x"
        )
        key = f"{which}/{case}" + ("" if other == "padded" else f" vs {other}")
        results[key] = report(
          f"{which} pass, {case} lengths (real tokens/s)",
          real,
          "tokens/s",
          {"packed": t_packed, other: t_other},
          warm,
          section,
          extra={"padding_share_padded": share["padded"], "padding_share_packed": share["packed"]},
          args=args,
          json_path=args.json and f"{args.json}.{which}.{case}{'' if other == 'padded' else '.' + other}.json",
        )
  print("\nsummary (packed / the other side's real tokens/s, ratio of mins):")
  for key, r in results.items():
    print(f"  {key}: {r['ratio_of_mins']:.2f}x")


def _window(window) -> str:
  if window is None:
    return "dense over the row"
  return f"in blocks of {window.block} over {window.blocks * window.block}-slot windows (span {window.span})"


if __name__ == "__main__":
  main()
