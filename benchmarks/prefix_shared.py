"""Prompt-shared vs repeated RL passes: the old-log-prob pass and the update step with each prompt run through the
decoder once for its group of G completions (`model.share_prompt`, the default) against once per completion.

    OMP_WAIT_POLICY=PASSIVE python -m benchmarks.prefix_shared [--prompts 1 --samples 8 --completion 384
        --image 868x896 --short_image 168x168 --median 200 --sigma 0.5 --micro 1 --remat dots --pairs 3
        --cases uniform,long-tailed,short-prompt --passes logprobs,update --json PATH]

`mid()` model (~60M params, random init), float32, CPU, one process, both sides' blocks under `--remat` (model.remat;
default 'dots', not the trainer's 'none': without it the repeated update at the default shapes asks XLA for ~20 GiB
of temporary buffers, the shared one ~9 GiB, more than a 23 GiB machine running other work holds; the log-prob pass
has no backward, so remat does not touch it). `--prompts` prompts of one random image each (`--image`, height x width pixels; 868x896 = 62 x 64 patches = 31 x 32 = 992 merged image tokens, which with
the chat template's 22 other tokens fills the 1,024-token prompt bucket, so P = 1,024 decoder slots with no bucket
padding to speak of), `--samples` (G) completions each, random tokens, random rewards, plain PPO (benchmarks.fixtures
.run_config). Cases: 'uniform' (every completion `--completion` tokens), 'long-tailed' (lengths drawn lognormal as
`benchmarks/rollout_lengths.py` draws them: median --median, shape --sigma, clipped to [1, --completion]; the
padded width the longest rounded up to 8, both sides the same arrays) and 'short-prompt' (`--short_image`, 168x168:
36 image tokens, P = 64; `--completion` tokens each), where prompt sharing saves little and should cost nothing.

Both sides' programs come from `RunPrograms` (`jaxcap.train.steps.programs`) of one run config differing only in
`model.share_prompt`, over two graphdefs of one model (the same params) whose configs differ only in
`share_prompt`; the prompts from the trainer's `Batcher`, so P is the bucketed prompt width the trainer runs. Each
program is compiled once for its inputs (`jit(...).lower(...).compile()`; compile time and XLA's temporary buffers,
`memory_analysis`, printed per side), so no timed call can compile again.
Decoder positions = the token slots the decoder runs per micro-batch pass, summed: repeated N x (P + C), shared
B x P + N x C (N = B x G sequences, C the completion width); their ratio is the work the shared pass saves in the
decoder's per-token matmuls (its attention saves too, by a different ratio; the vision tower runs once per image and
the LM head over the N x C completion positions on both sides, so neither saves anything).

tokens/s = real tokens (each sequence's real prompt tokens + its completion's tokens: a prompt counts once per
completion, the work both sides answer for) / wall time of one call. Each side is warmed up (compiled) and that
time reported apart, and so is its first call; then shared and repeated run interleaved, --pairs pairs per pass
and case (benchmarks/harness.py): min and median, ratio of mins (= repeated time / shared time, >1: sharing is faster), CPU
model and load average; and this process's CPU seconds per call (all its threads; less moved by other work on a
shared machine than the wall time, though not immune). The last line gives the main case (uniform, the long
prompt): `prefix-shared vs repeated: update N.NNx, logprobs N.NNx`, repeated time / shared time from the mins.
"""

from __future__ import annotations

import argparse
import json
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

CASES = ("uniform", "long-tailed", "short-prompt")
SIDES = ("shared", "repeated")


def _size(text: str) -> tuple[int, int]:
  h, _, w = text.lower().partition("x")
  return int(h), int(w or h)


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--prompts", type=int, default=1, help="prompts per step (B)")
  ap.add_argument("--samples", type=int, default=8, help="completions per prompt (G)")
  ap.add_argument("--completion", type=int, default=384, help="completion tokens (the long-tailed case's cap)")
  ap.add_argument("--image", default="868x896", help="image of the long-prompt cases, HxW pixels (992 tokens)")
  ap.add_argument("--short_image", default="168x168", help="image of the short-prompt case, HxW pixels (36 tokens)")
  ap.add_argument("--median", type=float, default=200, help="median completion length (tokens), long-tailed case")
  ap.add_argument("--sigma", type=float, default=0.5, help="lognormal shape of the long-tailed lengths")
  ap.add_argument("--micro", type=int, default=1, help="micro-batches (rl.micro_batches)")
  ap.add_argument("--cases", default=",".join(CASES))
  ap.add_argument("--passes", default="logprobs,update")
  ap.add_argument(
    "--remat",
    default="dots",
    choices=("none", "full", "dots"),
    help="model.remat of both sides (the repeated update without it needs ~20 GiB at the default shapes)",
  )
  add_arguments(ap)
  ap.set_defaults(pairs=3)  # the repeated update at the default shapes takes most of a minute on 2 cores
  args = ap.parse_args()
  cases = args.cases.split(",")
  if unknown := set(cases) - set(CASES):
    raise SystemExit(f"--cases: unknown {sorted(unknown)}; choose from {', '.join(CASES)}")

  import jax
  import jax.numpy as jnp
  from flax import nnx

  import jaxcap.models as M
  from jaxcap.processing import Processor, word_tokenizer
  from jaxcap.sampling.sampler import place_batch
  from jaxcap.sharding import make_mesh
  from jaxcap.train.rollouts.batching import Batcher
  from jaxcap.train.steps.programs import RunPrograms
  from jaxcap.train.steps.state import init_train_state
  from jaxcap.train.steps.updates import RolloutBatch

  rng = np.random.RandomState(0)
  cfg = M.mid(remat=args.remat)
  # one model, two graphdefs: the configs differ only in share_prompt, the params are the same arrays
  shared_graphdef, params = nnx.split(M.Qwen25VL(cfg.replace(share_prompt=True), rngs=nnx.Rngs(0)))
  repeated = nnx.eval_shape(lambda: M.Qwen25VL(cfg.replace(share_prompt=False), rngs=nnx.Rngs(0)))
  graphdefs = {"shared": shared_graphdef, "repeated": nnx.split(repeated)[0]}
  proc = Processor(word_tokenizer(WORDS, cfg), cfg)
  mesh = make_mesh({"fsdp": 1}, devices=jax.devices()[:1])
  b, g, m = args.prompts, args.samples, args.micro
  n = b * g
  if b % m:
    raise SystemExit(f"--prompts={b} must be divisible by --micro={m}")
  config = run_config("rl", max_new_tokens=args.completion)
  config.model.remat = args.remat  # for the record, as share_prompt below: the graphdefs carry both
  config.rl.update(dict(batch_size=b, num_samples=g, micro_batches=m))
  configs = {}
  for name, share in zip(SIDES, (True, False)):
    c = config.copy_and_resolve_references()
    c.model.share_prompt = share  # for the record: the programs read it from the graphdef's model config
    configs[name] = c
  programs = {name: RunPrograms(configs[name], graphdefs[name]) for name in SIDES}
  batcher = Batcher(proc, config, mesh, media_threads=1)
  print(
    f"mid model, float32, remat {args.remat}, {b} prompt(s) x {g} samples, {m} micro-batch(es); programs: RunPrograms of run configs "
    "differing only in model.share_prompt (graphdefs of one model, the same params)"
  )

  prompt_cache = {}

  def prompt_batch(image: str):
    """(PromptBatch, layouts, real prompt tokens per prompt, bucketed prompt width P) of `b` prompts of `image`."""
    if image not in prompt_cache:
      inputs = proc(sized_conversations([_size(image)] * b, rng), padding_side="left")
      host = batcher.host_prompts(inputs, m)
      placed = place_batch(host, cfg, batcher.pad_id, batcher.bucket_steps)
      prompts, layout = batcher.prompt_batch(placed, m)
      real = np.asarray(host.prompts.attention_mask)[: host.rows].sum(1)
      images = int((np.asarray(inputs.input_ids) == cfg.image_token_id).sum(1).max())
      prompt_cache[image] = prompts, layout, real, int(prompts.ids.shape[-1]), images
    return prompt_cache[image]

  results, main_case = {}, {}
  for case in cases:
    image = args.short_image if case == "short-prompt" else args.image
    prompts, layout, prompt_real, p_len, image_tokens = prompt_batch(image)
    if case == "long-tailed":
      lengths = stop_schedule(n, args.median, args.sigma, args.completion)["long-tailed"]
    else:
      lengths = np.full(n, args.completion, np.int64)
    width = int(-(-lengths.max() // 8) * 8)
    positions = {"shared": b * p_len + n * width, "repeated": n * (p_len + width)}
    real = int(np.repeat(prompt_real, g).sum() + lengths.sum())
    print(
      f"\n== {case}: image {image} px = {image_tokens} image tokens, prompts of {prompt_real.min()}..."
      f"{prompt_real.max()} real tokens in P = {p_len} slots; completions {lengths.min()}..{lengths.max()} tokens "
      f"(mean {lengths.mean():.0f}) in C = {width} slots; decoder positions: repeated N x (P + C) = {n} x "
      f"({p_len} + {width}) = {positions['repeated']}, shared B x P + N x C = {b} x {p_len} + {n} x {width} = "
      f"{positions['shared']}: {positions['repeated'] / positions['shared']:.2f}x fewer shared"
    )
    tokens = jnp.asarray(rng.randint(0, cfg.text.vocab_size, (m, n // m, width)).astype(np.int32))
    cmask = jnp.asarray((np.arange(width)[None] < lengths[:, None]).reshape(m, n // m, width))
    old = {name: programs[name].logprobs()(params, prompts, layout, tokens) for name in SIDES}
    diff = float(jnp.max(jnp.abs(jnp.where(cmask, old["shared"] - old["repeated"], 0.0))))
    print(f"old log-probs, shared vs repeated: max |diff| {diff:.2e} over the completion tokens")
    rewards = jnp.asarray(rng.randn(m, b // m, g, 1).astype(np.float32))
    batch = RolloutBatch(tokens, cmask, old["repeated"], rewards, jnp.ones(rewards.shape, bool), jnp.ones((1,)))
    del old

    for which in args.passes.split(","):
      calls, states, compiled, memory = {}, {}, {}, {}
      for name in SIDES:
        prog = programs[name]
        t0 = time.perf_counter()
        if which == "logprobs":
          fn = prog.logprobs().lower(params, prompts, layout, tokens).compile()
          calls[name] = lambda fn=fn: fn(params, prompts, layout, tokens).block_until_ready()
        elif which == "update":
          opt = prog.optimizer("rl")
          states[name] = init_train_state(jax.tree.map(jnp.copy, params), opt, jax.random.key(0))
          # the trainer's update (`rl_step`), jitted with the state donated, compiled once for these inputs
          step = jax.jit(prog.step_fn("rl", opt), donate_argnums=0)
          fn = step.lower(states[name], prompts, batch, layout).compile()

          def call(name=name, fn=fn):
            states[name], metrics = fn(states[name], prompts, batch, layout)
            jax.block_until_ready(metrics["loss"])

          calls[name] = call
        else:
          raise SystemExit(f"--passes: unknown {which!r}; choose from logprobs, update")
        compiled[name] = time.perf_counter() - t0
        memory[name] = fn.memory_analysis().temp_size_in_bytes / 2**30
      cpu = {name: [] for name in calls}  # this process's CPU seconds per call (all threads): less moved by load
      calls = {name: cpu_timed(fn, cpu[name]) for name, fn in calls.items()}
      warm = {name: warm_up(fn) for name, fn in calls.items()}
      for times in cpu.values():
        times.clear()
      print(
        f"-- {which} ({case}): compile "
        + ", ".join(f"{k} {v:.1f} s" for k, v in compiled.items())
        + "; first call "
        + ", ".join(f"{k} {v:.1f} s" for k, v in warm.items())
        + "; XLA temp buffers "
        + ", ".join(f"{k} {v:.2f} GiB" for k, v in memory.items())
      )
      with Section() as section:
        t_shared, t_repeated = interleaved(calls["shared"], calls["repeated"], args.pairs, names=SIDES)
      print(
        "CPU s per call (min / median): "
        + ", ".join(f"{k} {min(cpu[k]):.3f} / {np.median(cpu[k]):.3f}" for k in SIDES)
        + f"; ratio of mins {min(cpu['repeated']) / min(cpu['shared']):.2f}x"
      )
      key = f"{which}/{case}"
      results[key] = report(
        f"{which} pass, {case} (real tokens/s; ratio = repeated time / shared time)",
        real,
        "tokens/s",
        {"shared": t_shared, "repeated": t_repeated},
        warm,
        section,
        extra={
          "prompt_slots_P": p_len,
          "completion_slots_C": width,
          "sequences_N": n,
          "decoder_positions_shared": positions["shared"],
          "decoder_positions_repeated": positions["repeated"],
          "decoder_positions_ratio": positions["repeated"] / positions["shared"],
          "compile_s_shared": compiled["shared"],
          "compile_s_repeated": compiled["repeated"],
          "temp_gib_shared": memory["shared"],
          "temp_gib_repeated": memory["repeated"],
          "cpu_s_shared_min": min(cpu["shared"]),
          "cpu_s_repeated_min": min(cpu["repeated"]),
        },
        args=args,
      )
      if case == "uniform":
        main_case[which] = results[key]["ratio_of_mins"]
      calls = states = None  # the states (params and moments) freed before the next pass

  print("\nsummary (repeated time / shared time, ratio of mins; decoder positions repeated / shared):")
  for key, r in results.items():
    e = r["extra"]
    print(
      f"  {key}: {r['ratio_of_mins']:.2f}x (medians {r['ratio_of_medians']:.2f}x); positions "
      f"{e['decoder_positions_repeated']} / {e['decoder_positions_shared']} = {e['decoder_positions_ratio']:.2f}x"
      + ("" if r["quiet"] else "  [loaded machine: do not quote]")
    )
  if args.json:
    with open(args.json, "w") as f:
      json.dump(results, f, indent=2)
      f.write("\n")
    print(f"wrote {args.json}")
  fmt = lambda which: f"{main_case[which]:.2f}x" if which in main_case else "n/a"
  print(f"prefix-shared vs repeated: update {fmt('update')}, logprobs {fmt('logprobs')}")


if __name__ == "__main__":
  main()
