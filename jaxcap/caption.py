"""Bulk annotator: captions a folder (or manifest) of images with a Qwen2.5-VL checkpoint, resumably.

    python -m jaxcap.caption --checkpoint DIR --images DIR_OR_MANIFEST --out captions.jsonl

Output: one JSON line per image, {"id", "image", "caption", "tokens" (caption tokens, the stop token not counted),
"truncated" (hit --max_new_tokens before a stop token)}; an image that cannot be read
gets {"id", "image", "error"} in the errors file (default: <out stem>.errors.jsonl) and the run goes on.
Resumable: ids already in either file are skipped, finished lines are never rewritten (a torn last line from a
killed run is cut off and its image redone). Images keep their native size within the checkpoint's pixel budget
(its preprocessor_config.json, or --min_pixels / --max_pixels); they are ordered by size and batched, each batch
padded to a bucket, so a folder of many sizes compiles a handful of programs. Work is sharded over processes: process i of n takes every n-th image (sorted by id) and writes
`<out stem>-0000i-of-0000n.jsonl`; concatenate the shards afterwards. Within a process, every batch is split over
its local devices (data parallel; with --engine paged, each device runs an engine of its own with --slots slots).

--images is a directory (searched recursively; id = path relative to it), a .jsonl manifest with "id" and
"image" (path relative to the manifest's folder, inside it unless --media_root names another folder or
--allow_outside_paths; the synthetic-world manifest works as is), or a .txt list of paths (id = the path as written).
Videos (.mp4, .webm, .mov, ...) among them are captioned too: their frames are sampled as the checkpoint's
video_preprocessor_config.json says (a training run's export carries the run's own: data.video_fps, ...), as
training samples them; the --video_* flags change that, as the run's data.video_* fields do (e.g. --video_fps 1
--video_max_frames 16).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import zlib
from pathlib import Path
from typing import Sequence

from jaxcap.data.annotation_files import (
  DiskFullError,
  ImageListError,
  append_lines,
  finished_ids,
  list_images,
  shard_paths,
)
from jaxcap.processing.annotation_media import load_images, sort_by_size
from jaxcap.processing.video import SAMPLING_SETTINGS

DEFAULT_PROMPT = "Describe this image in detail."


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  ap = argparse.ArgumentParser(
    prog="python -m jaxcap.caption",
    description=__doc__.split("\n\n")[0],
    formatter_class=argparse.RawDescriptionHelpFormatter,
    epilog=__doc__,
  )
  ap.add_argument("--checkpoint", required=True, help="local HF Qwen2.5-VL checkpoint directory (with tokenizer)")
  ap.add_argument("--images", required=True, help="image / video folder, .jsonl manifest or .txt list of paths")
  ap.add_argument("--out", required=True, help="captions JSONL (appended to; resumable)")
  ap.add_argument(
    "--media_root", default=None, help="folder a .jsonl manifest's paths must lie in (default: the manifest's folder)"
  )
  ap.add_argument("--allow_outside_paths", action="store_true", help="read a .jsonl manifest's paths anywhere")
  ap.add_argument("--errors", default=None, help="errors JSONL (default: <out stem>.errors.jsonl)")
  ap.add_argument("--prompt", default=DEFAULT_PROMPT)
  ap.add_argument("--batch_size", type=int, default=16, help="images per batch (any sizes, padded to a bucket)")
  ap.add_argument("--max_new_tokens", type=int, default=512)
  ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
  ap.add_argument("--top_p", type=float, default=1.0)
  ap.add_argument("--top_k", type=int, default=0)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument(
    "--dtype",
    default="checkpoint",
    choices=("checkpoint", "float32", "bfloat16"),
    help="the weights' dtype (also the compute dtype); default: the checkpoint's own (config.json), bf16 as released",
  )
  ap.add_argument("--min_pixels", type=int, default=None, help="default: the checkpoint's preprocessor_config.json")
  ap.add_argument("--max_pixels", type=int, default=None, help="default: the checkpoint's preprocessor_config.json")
  videos = "default: the checkpoint's video_preprocessor_config.json (a run's export: the run's data.video_*)"
  ap.add_argument("--video_fps", type=float, default=None, help=f"video frames sampled per second; {videos}")
  ap.add_argument("--video_min_frames", type=int, default=None, help=f"fewest frames sampled from a video; {videos}")
  ap.add_argument("--video_max_frames", type=int, default=None, help=f"most frames sampled from a video; {videos}")
  ap.add_argument("--video_min_pixels", type=int, default=None, help=f"each video frame's pixel floor; {videos}")
  ap.add_argument("--video_max_pixels", type=int, default=None, help=f"each video frame's pixel ceiling; {videos}")
  ap.add_argument(
    "--video_total_pixels", type=int, default=None, help=f"a video's pixel budget, shared by its frames; {videos}"
  )
  ap.add_argument("--process_index", type=int, default=None, help="default: jax.process_index()")
  ap.add_argument("--process_count", type=int, default=None, help="default: jax.process_count()")
  ap.add_argument("--no_progress", action="store_true", help="no progress bar")
  ap.add_argument(
    "--engine", choices=("static", "paged"), default="static", help="paged: decode slots refilled as captions end"
  )
  ap.add_argument(
    "--slots",
    type=int,
    default=None,
    help="paged engine: decode slots per device (default: --batch_size); each of the process's devices runs an "
    "engine of its own over its share of every batch",
  )
  ap.add_argument("--page_size", type=int, default=16, help="paged engine: tokens per KV-cache page")
  ap.add_argument("--segment_steps", type=int, default=32, help="paged engine: decode steps between refills")
  ap.add_argument(
    "--stream_images",
    type=int,
    default=256,
    help="paged engine: images per engine call, per process (whole batches; the slots stay full across them, "
    "captions are written after each call)",
  )
  args = ap.parse_args(argv)
  if args.batch_size < 1:
    ap.error(f"--batch_size={args.batch_size}; use at least 1")
  for flag in SAMPLING_SETTINGS:
    value = getattr(args, flag)
    if value is not None and value <= 0:
      ap.error(f"--{flag}={value}; use a positive number (or leave it out: the checkpoint's own)")
  return args


class FlagError(ValueError):
  """Flags the checkpoint's processor cannot take (one line, exit 2)."""


def with_video_flags(video_cfg, args: argparse.Namespace):
  """The checkpoint's video settings with the --video_* flags given, by the rule the run's data.video_* fields
  follow (`VideoPreprocessConfig.with_sampling`); FlagError naming the flag where they cannot apply."""
  given = {arg: getattr(args, flag) for flag, arg in SAMPLING_SETTINGS.items() if getattr(args, flag) is not None}
  if not given:
    return video_cfg
  try:
    return video_cfg.with_sampling(**given, names={arg: f"--{flag}" for flag, arg in SAMPLING_SETTINGS.items()})
  except ValueError as e:
    raise FlagError(str(e)) from None


def main(argv: Sequence[str] | None = None) -> int:
  from jaxcap.caption_memory import out_of_memory
  from jaxcap.checkpoint import CheckpointError
  from jaxcap.sampling.footprint import MemoryShortError

  try:
    return annotate(parse_args(argv))
  except DiskFullError as e:  # one line: the output written so far is whole and the rerun resumes after it
    print(f"error: {e}", file=sys.stderr, flush=True)
    return 1
  except MemoryShortError as e:  # the memory check, before loading: one line with the numbers and the fix
    print(f"error: {e}", file=sys.stderr, flush=True)
    return 2
  except (
    CheckpointError,
    ImageListError,
    FlagError,
    FileNotFoundError,
    NotADirectoryError,
    FileExistsError,
    PermissionError,
  ) as e:
    # bad input (no checkpoint, no images folder, an output path that cannot be written): one line, nothing lost
    what = f"cannot use {e.filename}: {e.strerror}" if isinstance(e, OSError) and e.filename else str(e)
    if isinstance(e, FileExistsError) and e.filename:  # a folder of the output path is a file
      what = f"cannot use {e.filename} as a folder of --out: it is a file"
    print(f"error: {what}", file=sys.stderr, flush=True)
    return 2
  except Exception as e:  # an allocation the memory check did not foresee: one line, the captions so far are kept
    if not out_of_memory(e):
      raise
    first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
    print(
      f"error: jaxcap.caption ran out of memory ({first}); the captions written so far are kept: rerun with a "
      "smaller --batch_size or --max_pixels, which resumes after them",
      file=sys.stderr,
      flush=True,
    )
    return 1


def annotate(args: argparse.Namespace) -> int:
  """Captions every pending image of `args` (parse_args); 0 when done."""
  import jax
  from tqdm import tqdm
  from jaxcap.checkpoint import CheckpointError, checkpoint_dtype, load_hf_checkpoint, read_config
  from jaxcap.processing import Processor
  from jaxcap.sampling import SamplingConfig
  from jaxcap.caption_memory import check_flags
  from jaxcap.sampling.engine import make_sampler
  from jaxcap.sharding import make_mesh

  # bad input first, before any backend starts (a backend's start-up logs would bury the one-line error)
  run_export = Path(args.checkpoint) / "export"
  if (run_export / "config.json").is_file() and (Path(args.checkpoint) / "checkpoints").is_dir():
    raise CheckpointError(f"{args.checkpoint} is a training run's workdir; its policy is --checkpoint {run_export}")
  read_config(args.checkpoint)
  images = list_images(args.images, media_root=args.media_root, allow_outside_paths=args.allow_outside_paths)
  index = jax.process_index() if args.process_index is None else args.process_index
  count = jax.process_count() if args.process_count is None else args.process_count
  if not 0 <= index < count:
    raise SystemExit(f"--process_index={index} is outside [0, --process_count={count})")
  out_path, err_path = shard_paths(args.out, args.errors, index, count)
  out_path.parent.mkdir(parents=True, exist_ok=True)
  from jaxcap.locking import lock_output

  lock = lock_output(out_path)  # noqa: F841  (held until main returns: one writer per output file)
  done = finished_ids(out_path) | finished_ids(err_path)
  mine = images[index::count]
  pending = [it for it in mine if it.id not in done]
  print(
    f"jaxcap.caption: process {index}/{count}: {len(mine)} images, {len(mine) - len(pending)} already done, "
    f"{len(pending)} to caption -> {out_path}",
    file=sys.stderr,
  )
  if not pending:
    return 0

  # Data parallel over this process's devices; other processes work on other images, no collectives needed.
  mesh = make_mesh({"data": -1}, devices=jax.local_devices())
  processor = Processor.from_pretrained(args.checkpoint)  # the checkpoint's pixel budget, as transformers
  budget = {k: getattr(args, k) for k in ("min_pixels", "max_pixels") if getattr(args, k) is not None}
  processor.vision_cfg = dataclasses.replace(processor.vision_cfg, **budget)
  processor.video_cfg = with_video_flags(processor.video_cfg, args)  # frames sampled as the run sampled them
  sampling = SamplingConfig(
    temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, max_new_tokens=args.max_new_tokens
  )
  ordered, errors = sort_by_size(pending, processor)
  append_lines(err_path, errors)
  param_dtype = checkpoint_dtype(args.checkpoint, args.dtype)
  if ordered:
    with jax.set_mesh(mesh):  # the decode layout the check counts depends on the mesh
      check_flags(args, read_config(args.checkpoint, dtype=param_dtype, param_dtype=param_dtype), ordered, processor)
  bar = tqdm(total=len(pending), unit="img", disable=args.no_progress, dynamic_ncols=True)
  bar.update(len(errors))
  n_errors = len(errors)
  with jax.set_mesh(mesh):
    # the decoder's layers are read straight into the decode layout: the stack is never held
    model = load_hf_checkpoint(args.checkpoint, mesh=mesh, param_dtype=param_dtype, layers_apart=True)
    if args.engine == "paged":
      from jaxcap.sampling.engine import EngineConfig

      engine = EngineConfig(args.slots or args.batch_size, args.page_size, args.segment_steps)
    else:
      engine = None
    sampler = make_sampler(model, engine=engine, processor=processor, sampling=sampling, owns_weights=True)
    stops = set(sampling.resolve_stop_ids(processor.cfg.eos_token_id))
    # the paged engine takes --stream_images images (whole batches) per call: its slots stay full across them
    window = args.batch_size * (max(1, args.stream_images // args.batch_size) if args.engine == "paged" else 1)
    for start in range(0, len(ordered), window):
      batches = []
      for first in range(start, min(start + window, len(ordered)), args.batch_size):
        loaded, bad = load_images(ordered[first : first + args.batch_size], processor)
        append_lines(err_path, bad)
        n_errors += len(bad)
        bar.update(len(bad))
        batches += [loaded] if loaded else []
      conversations = [
        [[{"role": "user", "content": [media, {"type": "text", "text": args.prompt}]}] for _, media in loaded]
        for loaded in batches
      ]
      keys = [jax.random.fold_in(jax.random.key(args.seed), zlib.crc32(b[0][0].id.encode())) for b in batches]
      if not batches:
        results = []
      elif args.engine == "paged":  # one engine call, keyed by its first image, one engine per device
        # every batch's rows a multiple of the devices (a short last batch too), so each splits over all of them
        # (`mesh_shards.spread`: a batch that does not would leave the whole call to fewer devices)
        results = sampler.stream([sampler.bucket(c, rows_multiple=mesh.size) for c in conversations], keys[0])
      else:
        results = [sampler(c, k) for c, k in zip(conversations, keys)]
      for loaded, result in zip(batches, results):
        append_lines(out_path, caption_rows(loaded, result, stops))
        bar.update(len(loaded))
      bar.set_postfix(errors=n_errors, refresh=False)
  bar.close()
  return 0


def caption_rows(loaded, result, stops: set[int]) -> list[dict]:
  """The output lines of a batch: `loaded` (item, media) pairs and their `Rollouts` (one sample each)."""
  import jax

  tokens, lengths = jax.device_get((result.tokens, result.lengths))
  rows = []
  for (item, _), text, row_tokens, n in zip(loaded, result.text, tokens, lengths):
    stopped = int(row_tokens[n - 1]) in stops
    rows.append(
      {"id": item.id, "image": item.path, "caption": text, "tokens": int(n) - stopped, "truncated": not stopped}
    )
  return rows


if __name__ == "__main__":
  from jaxcap.host_memory import retain_on_cpu

  retain_on_cpu()
  sys.exit(main())
