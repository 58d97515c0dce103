"""Rollouts at dense-caption lengths: the paged engine (slots refilled as samples finish) vs the static sampler.

    OMP_WAIT_POLICY=PASSIVE python -m benchmarks.rollout_lengths [--prompts 16 --samples 8 --median 400
        --sigma 0.5 --cap 2048 --pairs 5]

A benchmark-only stop schedule forces each sample's length: drawn once from a lognormal (median --median, shape
--sigma, clipped to [1, --cap]) for the long-tailed case, and every sample the lognormal draws' mean for the
uniform case (the same total of generated tokens). The static sampler pays for a stop schedule what it pays for
real stops: every row steps until the longest caption ends, so it runs with no stop ids and max_new_tokens = the
longest forced length (the same loop, the same steps). The engine gets the lengths as per-sample caps
(`max_lengths`) and frees a sample's slot and pages when it reaches its length.

`mid()` model (~60M params, random init), temperature 1, square images of --image_size pixels, on CPU.
tokens/s = generated tokens (the schedule's sum) / wall time of one call, prefill and vision included. Each side is
warmed up once (compiles) and that time reported apart; then engine and static run interleaved, --pairs pairs
per case (benchmarks/harness.py): min and median, ratio of mins, CPU model and load average.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
from pathlib import Path

import numpy as np

if not __package__:  # run as a file: the repository root, for `benchmarks.*`
  sys.path.append(str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import Section, add_arguments, interleaved, warm_up  # noqa: E402
from benchmarks.report import report  # noqa: E402


PROMPT = "describe the image in detail ."


def stop_schedule(count: int, median: float, sigma: float, cap: int, seed: int = 0) -> dict[str, np.ndarray]:
  """Forced lengths int [count] per case: 'long-tailed' (lognormal, clipped to [1, cap]) and 'uniform' (their
  mean, the same total up to rounding)."""
  rng = np.random.RandomState(seed)
  tail = np.clip(np.round(median * np.exp(sigma * rng.randn(count))), 1, cap).astype(np.int64)
  return {"long-tailed": tail, "uniform": np.full(count, int(round(tail.mean())), np.int64)}


def mid_model():
  """(the `mid()` model, random init through a saved transformers checkpoint; a word-level processor)."""
  import transformers

  from jaxcap.checkpoint import load_hf_checkpoint
  from jaxcap.models import mid
  from jaxcap.processing import Processor, word_tokenizer

  cfg = mid()
  hf = transformers.Qwen2_5_VLForConditionalGeneration(transformers.Qwen2_5_VLConfig(**cfg.to_hf_dict())).float()
  with tempfile.TemporaryDirectory() as tmp:
    hf.save_pretrained(tmp)
    model = load_hf_checkpoint(tmp)
  return model, Processor(word_tokenizer(PROMPT.split(), cfg), cfg)


def image_prompts(sides, rng: np.random.RandomState) -> list:
  """One conversation per (height, width) of `sides`: a random image and PROMPT."""
  return [
    [
      {
        "role": "user",
        "content": [
          {"type": "image", "image": (rng.rand(h, w, 3) * 255).astype(np.uint8)},
          {"type": "text", "text": PROMPT},
        ],
      }
    ]
    for h, w in sides
  ]


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--prompts", type=int, default=16)
  ap.add_argument("--samples", type=int, default=8, help="G, samples per prompt")
  ap.add_argument("--median", type=float, default=400, help="median forced caption length, tokens")
  ap.add_argument("--sigma", type=float, default=0.5, help="lognormal shape of the long-tailed lengths")
  ap.add_argument("--cap", type=int, default=2048, help="longest caption, tokens")
  ap.add_argument("--image_size", type=int, default=224)
  ap.add_argument("--slots", type=int, default=0, help="the engine's decode slots (0 = one per sample)")
  ap.add_argument("--page_size", type=int, default=16)
  ap.add_argument("--segment_steps", type=int, default=32)
  ap.add_argument("--cases", default="long-tailed,uniform")
  add_arguments(ap)
  args = ap.parse_args()

  import jax

  from jaxcap.sampling import SamplingConfig
  from jaxcap.sampling import paged_slots
  from jaxcap.sampling.engine import EngineConfig, make_sampler

  model, processor = mid_model()
  rng = np.random.RandomState(0)
  conversations = image_prompts([(args.image_size, args.image_size)] * args.prompts, rng)
  g = args.samples
  rows = args.prompts * g
  engine = EngineConfig(slots=args.slots or rows, page_size=args.page_size, segment_steps=args.segment_steps)
  keys = itertools.count()
  schedules = stop_schedule(rows, args.median, args.sigma, args.cap)
  print(
    f"mid(): {args.prompts} prompts x G {g} = {rows} samples; engine {engine}; jax {jax.__version__} on "
    f"{jax.devices()[0].platform}"
  )
  for case in args.cases.split(","):
    lengths = schedules[case]
    longest = int(lengths.max())
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=longest, stop_ids=())
    static = make_sampler(model, processor=processor, sampling=sampling)
    paged = make_sampler(model, processor=processor, sampling=sampling, engine=engine)
    batch = static.bucket(conversations)
    forced = np.zeros(batch.block * g, np.int64)
    forced[:rows] = lengths
    stats: dict = {}
    got = []

    def engine_call():
      out = paged(batch, jax.random.key(next(keys)), num_samples=g, max_lengths=forced, stats=stats)
      got.append(jax.block_until_ready(out.lengths))

    def static_call():
      jax.block_until_ready(static(batch, jax.random.key(next(keys)), num_samples=g).tokens)

    total = int(lengths.sum())
    print(
      f"\n{case}: lengths min {lengths.min()} median {int(np.median(lengths))} mean {lengths.mean():.0f} max "
      f"{longest}; {total} tokens; the static sampler steps {longest} x {batch.block * g} rows "
      f"({total / (longest * batch.block * g):.0%} of its row-steps useful)",
      flush=True,
    )
    warmup = {"engine": warm_up(engine_call), "static": warm_up(static_call)}
    traces = dict(paged_slots.TRACE_COUNTS)
    with Section() as section:
      engine_s, static_s = interleaved(engine_call, static_call, args.pairs, names=("engine", "static"))
    assert all(np.array_equal(np.asarray(n)[:rows], lengths) for n in got), "the engine missed the schedule"
    recompiled = {k: v - traces.get(k, 0) for k, v in paged_slots.TRACE_COUNTS.items() if v != traces.get(k, 0)}
    report(
      f"rollout at forced lengths, {case}",
      total,
      "tokens/s",
      {"engine": engine_s, "static": static_s},
      warmup,
      section,
      extra=dict(
        samples=rows,
        longest=longest,
        segments_per_call=stats.get("segments"),
        compactions_per_call=stats.get("compactions", 0),
        # decode steps x compiled rows: the static sampler's is longest x rows
        row_steps=dict(engine=stats.get("row_steps"), static=longest * batch.block * g),
        # cache positions each row's attention read, summed over steps (the static sampler reads its shared
        # prompt once per prompt and every row its own max_new_tokens slots at every step)
        attention_positions=dict(
          engine=stats.get("attention_positions"),
          static=longest * batch.block * (batch.prompts.length + g * longest),
        ),
        scheduler_host_s_per_call=round(stats.get("host_s", 0.0), 3),
        pages=stats.get("pages"),
        engine_programs=traces,
        compiled_while_timed=recompiled or "none",
        prompt_tokens=batch.prompts.length,
      ),
      args=args,
      json_path=args.json.replace(".json", f"_{case}.json") if args.json else None,
    )


if __name__ == "__main__":
  main()
