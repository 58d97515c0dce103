"""The annotator's decode on a folder of mixed-size images: one paged-engine call streaming every batch (what
`jaxcap.caption --engine paged` does per --stream_images window) vs the static sampler batch by batch (what
`jaxcap.caption` does by default), at long-tailed caption lengths.

    OMP_WAIT_POLICY=PASSIVE python -m benchmarks.caption_stream [--images 64 --batch_size 8 --median 100
        --sigma 0.5 --cap 400 --pairs 3]

`mid()` model (random init), greedy; --images random images of mixed sizes, ordered by size and cut into batches
of --batch_size as the annotator does. A benchmark-only stop schedule forces each caption's length (lognormal,
as benchmarks/rollout_lengths.py): the static sampler decodes each batch to its longest forced length (what real
stops cost it: every row steps until the batch's longest caption ends); the engine (slots = --batch_size, the
annotator's default) gets the lengths as per-caption caps. images/s = images / wall time of the whole folder,
vision and prefill included. Same captions: each image's forced-length tokens compared between the two.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
from pathlib import Path

import numpy as np

if not __package__:  # run as a file: the repository root, for `benchmarks.*`
  sys.path.append(str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import Section, add_arguments, interleaved, warm_up  # noqa: E402
from benchmarks.report import report  # noqa: E402
from benchmarks.rollout_lengths import image_prompts, mid_model, stop_schedule  # noqa: E402

SIDES = ((56, 84), (84, 84), (84, 140), (112, 112), (112, 168), (140, 140), (168, 168), (112, 224))


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--images", type=int, default=64)
  ap.add_argument("--batch_size", type=int, default=8)
  ap.add_argument("--median", type=float, default=100, help="median forced caption length, tokens")
  ap.add_argument("--sigma", type=float, default=0.5)
  ap.add_argument("--cap", type=int, default=400)
  ap.add_argument("--page_size", type=int, default=16)
  ap.add_argument("--segment_steps", type=int, default=32)
  add_arguments(ap)
  args = ap.parse_args()

  import jax

  from jaxcap.sampling import SamplingConfig
  from jaxcap.sampling.engine import EngineConfig, make_sampler

  model, processor = mid_model()
  rng = np.random.RandomState(0)
  sides = [SIDES[i] for i in rng.randint(len(SIDES), size=args.images)]
  sides.sort(key=lambda s: s[0] * s[1])  # the annotator orders by processed size
  convs = image_prompts(sides, rng)
  b = args.batch_size
  groups = [convs[i : i + b] for i in range(0, len(convs), b)]
  lengths = stop_schedule(args.images, args.median, args.sigma, args.cap)["long-tailed"]
  rng.shuffle(lengths)  # caption length independent of image size
  parts = [lengths[i : i + b] for i in range(0, len(lengths), b)]
  greedy = SamplingConfig(temperature=0.0, max_new_tokens=args.cap, stop_ids=())
  static = {
    int(p.max()): make_sampler(
      model, processor=processor, sampling=dataclasses.replace(greedy, max_new_tokens=int(p.max()))
    )
    for p in parts
  }
  engine = EngineConfig(slots=b, page_size=args.page_size, segment_steps=args.segment_steps)
  paged = make_sampler(model, processor=processor, sampling=greedy, engine=engine)
  any_static = next(iter(static.values()))
  batches = [any_static.bucket(g) for g in groups]
  forced = np.concatenate([np.pad(p, (0, batch.block - len(p))) for p, batch in zip(parts, batches)])
  keys = itertools.count()
  stats: dict = {}
  got: dict = {}

  def engine_call():
    outs = paged.stream(batches, jax.random.key(next(keys)), max_lengths=forced, stats=stats)
    got["engine"] = [np.asarray(o.tokens) for o in outs]

  def static_call():
    got["static"] = [
      np.asarray(static[int(p.max())](bt, jax.random.key(next(keys))).tokens) for p, bt in zip(parts, batches)
    ]

  total = int(lengths.sum())
  steps = sum(int(p.max()) * len(p) for p in parts)
  print(
    f"mid(): {args.images} images in {len(groups)} batches of {b}, {len(set(sides))} sizes; forced lengths min "
    f"{lengths.min()} median {int(np.median(lengths))} max {lengths.max()}, {total} tokens; the static sampler's "
    f"row-steps {total / steps:.0%} useful; engine {engine}; jax {jax.__version__}",
    flush=True,
  )
  warmup = {"engine": warm_up(engine_call), "static": warm_up(static_call)}
  with Section() as section:
    engine_s, static_s = interleaved(engine_call, static_call, args.pairs, names=("engine", "static"))
  same = sum(
    np.array_equal(e[i, :n], s[i, :n]) for p, e, s in zip(parts, got["engine"], got["static"]) for i, n in enumerate(p)
  )
  report(
    "annotator decode of a mixed-size folder, long-tailed lengths",
    args.images,
    "images/s",
    {"engine": engine_s, "static": static_s},
    warmup,
    section,
    extra=dict(
      same_captions=f"{same} of {args.images}",
      tokens=total,
      segments_per_call=stats.get("segments"),
      row_steps=dict(
        engine=stats.get("row_steps"), static=sum(int(p.max()) * bt.block for p, bt in zip(parts, batches))
      ),
    ),
    args=args,
    json_path=args.json or None,
  )


if __name__ == "__main__":
  main()
