"""Native-resolution batches: how many programs a stream of mixed image sizes compiles, what the bucket padding
costs, and how fast a mixed-size batch runs per real token against a same-size batch of equal token count.

    python -m benchmarks.mixed_sizes [--images 1000] [--batch 8] [--micro 2] [--pairs 5] [--json mixed.json]

Part 1 (host only, Qwen2.5-VL-3B geometry and pixel budget 3136 .. 12,845,056 px as its preprocessor_config):
`--images` COCO-like sizes (70% landscape 640 x 360..640, 20% portrait, 10% any side 200..1000) in steps of
`--batch` prompts, in shuffled order or grouped by size (`data.group_by_size`), per `data.bucket_steps`; counts the distinct shapes of the sampler's prefill (rows, prompt length, vision layout),
its decode loop (rows, prompt length) and the update's micro-batches (`--micro`), and the padding ratios
(padded / real vision patches, padded / real prompt tokens).
Part 2 (timed): the `mid` model's jitted forward on a batch of `--batch` images of mixed sizes padded to its
bucket (a random mix, and a mix as one `group_by_size` window gives) vs a batch of one size with about the same
number of real tokens, interleaved (benchmarks/harness.py); reports the time per real token and the ratio.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

if not __package__:  # run as a file (python benchmarks/mixed_sizes.py): the repository root, for `benchmarks.*`
  sys.path.append(str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import Section, add_arguments, interleaved, warm_up  # noqa: E402
from benchmarks.report import report  # noqa: E402

TEXT_TOKENS = 24  # chat template + instruction around the image


def coco_like_sizes(n: int, rng: np.random.RandomState) -> list[tuple[int, int]]:
  """(height, width) pixels of `n` images shaped like COCO's: mostly 640 on the long side."""
  out = []
  for _ in range(n):
    u = rng.rand()
    if u < 0.7:
      out.append((int(rng.randint(360, 641)), 640))
    elif u < 0.9:
      out.append((640, int(rng.randint(360, 641))))
    else:
      out.append((int(rng.randint(200, 1001)), int(rng.randint(200, 1001))))
  return out


def stream_programs(sizes, batch: int, micro: int, cfg, steps: int) -> dict:
  """Distinct program shapes and padding of a stream of `sizes`, batched in order, as the trainer buckets them."""
  from jaxcap.buckets import batch_bucket, ladder
  from jaxcap.models.vision import layout_shape
  from jaxcap.processing.vision import smart_resize

  v = cfg.vision
  factor = v.patch_size * v.spatial_merge_size
  prefill, decode, update = set(), set(), set()
  real_patches = padded_patches = real_tokens = padded_tokens = 0
  for start in range(0, len(sizes) - batch + 1, batch):
    grids = []
    for h, w in sizes[start : start + batch]:
      rh, rw = smart_resize(h, w, factor, 56 * 56, 12845056)
      grids.append((1, rh // v.patch_size, rw // v.patch_size))
    grids = np.asarray(grids)
    lengths = TEXT_TOKENS + np.prod(grids, -1) // v.spatial_merge_size**2
    length = ladder(int(lengths.max()), 16, steps)
    shape = layout_shape(grids, v).bucketed(v, steps)
    rows = batch_bucket(batch)
    prefill.add((rows, length, shape))
    decode.add((rows, length))
    mb = batch // micro
    micro_shape = None
    for m in range(micro):
      s = layout_shape(grids[m * mb : (m + 1) * mb], v).bucketed(v, steps)
      micro_shape = s if micro_shape is None else micro_shape.union(s)
    update.add((micro, mb, length, micro_shape))
    real_patches += int(np.prod(grids, -1).sum())
    padded_patches += shape.patches
    real_tokens += int(lengths.sum())
    padded_tokens += length * batch
  return dict(
    steps=len(sizes) // batch,
    prefill_programs=len(prefill),
    decode_programs=len(decode),
    update_programs=len(update),
    patch_padding=padded_patches / real_patches,
    token_padding=padded_tokens / real_tokens,
  )


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--images", type=int, default=1000)
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--micro", type=int, default=2)
  ap.add_argument("--scale", type=float, default=0.35, help="image sides of the timed batch, relative to COCO's")
  ap.add_argument("--steps", type=int, default=2, help="bucket sizes per octave of the timed batches")
  add_arguments(ap)
  args = ap.parse_args()

  import jax
  import jax.numpy as jnp
  from flax import nnx

  import jaxcap.models as M
  from benchmarks.fixtures import WORDS, sized_conversations
  from jaxcap.processing import Processor, word_tokenizer
  from jaxcap.sampling import bucket_prompts

  rng = np.random.RandomState(0)
  sizes = coco_like_sizes(args.images, rng)
  stream = {}
  print(f"stream of {args.images} COCO-like images, {args.batch} per step, 3B geometry:")
  print("  bucket_steps  group_by_size  prefill  decode  update programs  patches padded/real  tokens padded/real")
  from jaxcap.train.rollouts.size_groups import size_grouped_order

  cfg3b = M.qwen25vl_3b()
  patches = np.array([h * w for h, w in sizes])  # the grouping key: any monotone size will do
  for steps, group in ((1, 0), (2, 0), (4, 0), (1, 16), (2, 16), (4, 16)):
    order = size_grouped_order(patches, args.batch, group, seed=0, epoch=0) if group else np.arange(len(sizes))
    r = stream_programs([sizes[i] for i in order], args.batch, args.micro, cfg3b, steps)
    stream[f"steps{steps}_group{group}"] = r
    print(
      f"  {steps:12d}  {group:13d}  {r['prefill_programs']:7d}  {r['decode_programs']:6d}  "
      f"{r['update_programs']:15d}  {r['patch_padding']:19.3f}  {r['token_padding']:18.3f}"
    )

  cfg = M.mid()
  model = M.Qwen25VL(cfg, rngs=nnx.Rngs(0))
  proc = Processor(word_tokenizer(WORDS, cfg), cfg)
  graphdef, params = nnx.split(model)

  @jax.jit
  def forward(params, ids, pos, mask, vision):
    return nnx.merge(graphdef, params)(ids, pos, mask, vision)[0]

  def prepared(sides):
    prompts, rows, _ = bucket_prompts(proc(sized_conversations(sides, rng)), cfg, steps=args.steps)
    vision = prompts.vision
    args_ = (
      jnp.asarray(prompts.input_ids),
      jnp.asarray(prompts.positions),
      jnp.asarray(prompts.attention_mask),
      type(vision)(jnp.asarray(vision.pixel_values), jax.tree.map(jnp.asarray, vision.layout)),
    )
    real = int(np.asarray(prompts.attention_mask[:rows]).sum())
    return args_, real, prompts

  scale = lambda sides: [(int(h * args.scale), int(w * args.scale)) for h, w in sides]
  random_sides = scale(coco_like_sizes(args.batch, rng))
  window = sorted(coco_like_sizes(16 * args.batch, rng), key=lambda s: s[0] * s[1])  # one group_by_size window
  grouped_sides = scale(window[7 * args.batch : 8 * args.batch])
  batches = {"random mix": prepared(random_sides), "grouped mix": prepared(grouped_sides)}
  records = {}
  for name, sides in (("random mix", random_sides), ("grouped mix", grouped_sides)):
    mixed, mixed_real, mixed_prompts = batches[name]
    side = int(np.sqrt(np.mean([h * w for h, w in sides])))
    same, same_real, same_prompts = prepared([(side, side)] * args.batch)
    print(
      f"\n{name}: mid model, {args.batch} images {sides}: {mixed_real} real tokens, padded "
      f"{mixed_prompts.input_ids.size} tokens / {mixed_prompts.vision.pixel_values.shape[0]} patches; one size "
      f"{side}x{side}: {same_real} real tokens, padded {same_prompts.input_ids.size} / "
      f"{same_prompts.vision.pixel_values.shape[0]}"
    )
    run_mixed = lambda a=mixed: forward(params, *a).block_until_ready()
    run_same = lambda a=same: forward(params, *a).block_until_ready()
    warmup = {"mixed": warm_up(run_mixed), "same": warm_up(run_same)}
    with Section() as section:
      mixed_s, same_s = interleaved(run_mixed, run_same, args.pairs, names=("mixed", "same"))
    # per real token: the one-size side's times scaled to the mixed batch's real token count
    same_scaled = [t * mixed_real / same_real for t in same_s]
    records[name] = report(
      f"{name} forward vs one size (time per real token)",
      mixed_real,
      "real tokens/s",
      {"mixed": mixed_s, "same": same_scaled},
      warmup,
      section,
      extra=dict(stream=stream, sides=sides, same_side=side, mixed_real=mixed_real, same_real=same_real),
      args=args,
      json_path=args.json.replace(".json", f"_{name.split()[0]}.json") if args.json else None,
    )
  for name, record in records.items():
    print(f"{name}: x{1 / record['ratio_of_mins']:.3f} the one-size batch's time per real token")


if __name__ == "__main__":
  main()
