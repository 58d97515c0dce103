"""Bulk annotator: captions a folder (or manifest) of images with a Qwen2.5-VL checkpoint, resumably.

    python -m jaxcap.caption --checkpoint DIR --images DIR_OR_MANIFEST --out captions.jsonl

Output: one JSON line per image, {"id", "image", "caption", "tokens" (caption tokens, the stop token not counted),
"truncated" (hit --max_new_tokens before a stop token)}; an image that cannot be read
gets {"id", "image", "error"} in the errors file (default: <out stem>.errors.jsonl) and the run goes on.
Resumable: ids already in either file are skipped, finished lines are never rewritten (a torn last line from a
killed run is cut off and its image redone). Images keep their native size within the checkpoint's pixel budget
(its preprocessor_config.json, or --min_pixels / --max_pixels); they are ordered by size and batched, each batch
padded to a bucket, so a folder of many sizes compiles a handful of programs. Work is sharded over processes: process i of n takes every n-th image (sorted by id) and writes
`<out stem>-0000i-of-0000n.jsonl`; concatenate the shards afterwards.

--images is a directory (searched recursively; id = path relative to it), a .jsonl manifest with "id" and
"image" (path relative to the manifest's folder; the synthetic-world manifest works as is), or a .txt list of
paths (id = the path as written).
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import os
import pathlib
import shutil
import stat
import sys
import zlib
from typing import Iterable, Sequence

import numpy as np

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff"}
VIDEO_SUFFIXES = {".mp4", ".webm", ".mkv", ".mov", ".avi"}
DEFAULT_PROMPT = "Describe this image in detail."


@dataclasses.dataclass(frozen=True)
class ImageItem:
  id: str
  path: str


def scan_directory(source: pathlib.Path) -> tuple[list[ImageItem], list[tuple[str, str]]]:
  """The images and videos under a directory (recursively; symbolic links to files followed, to directories not)
  and (path, why) of every other path passed over: a directory or a broken / looping link with a media suffix, a
  link to a directory, a file without a media suffix."""
  items, skipped = [], []
  media = IMAGE_SUFFIXES | VIDEO_SUFFIXES
  for p in sorted(source.rglob("*")):
    rel = p.relative_to(source).as_posix()
    try:
      st = p.stat()  # follows links: a loop raises ELOOP, a dangling link FileNotFoundError
    except OSError as e:
      if not p.is_symlink():
        why = f"cannot be read ({e.strerror})"
      elif e.errno == errno.ELOOP:
        why = "a symbolic link loop"
      else:
        why = f"a symbolic link to a missing file ({os.readlink(p)})"
      skipped.append((str(p), why))
      continue
    if stat.S_ISDIR(st.st_mode):
      if p.is_symlink():
        skipped.append((str(p), "a symbolic link to a directory (not followed)"))
      elif p.suffix.lower() in media:
        skipped.append((str(p), f"a directory named like a {p.suffix} file"))
    elif not stat.S_ISREG(st.st_mode):
      skipped.append((str(p), "not a regular file"))
    elif p.suffix.lower() in media:
      items.append(ImageItem(rel, str(p)))
    else:
      skipped.append((str(p), "not an image or video suffix"))
  return items, skipped


def log_skipped(skipped: Sequence[tuple[str, str]], out=None) -> None:
  """One stderr line per path passed over (those without a media suffix: one line with their count and a few)."""
  out = out or sys.stderr
  plain = [p for p, why in skipped if why == "not an image or video suffix"]
  for path, why in skipped:
    if why != "not an image or video suffix":
      print(f"jaxcap.caption: skipped {path}: {why}", file=out)
  if plain:
    shown = ", ".join(plain[:3]) + (", ..." if len(plain) > 3 else "")
    print(f"jaxcap.caption: skipped {len(plain)} files without an image or video suffix: {shown}", file=out)


def list_images(source: str | os.PathLike, log=log_skipped) -> list[ImageItem]:
  """Every image of a directory / .jsonl manifest / .txt list, sorted by id; duplicate ids are an error. Paths of
  a directory that are not taken go to `log` (scan_directory's (path, why) pairs)."""
  source = pathlib.Path(source)
  if source.is_dir():
    items, skipped = scan_directory(source)
    if skipped:
      log(skipped)
  elif source.suffix == ".jsonl":
    items = []
    for n, line in enumerate(source.read_text().splitlines(), 1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
        path = pathlib.Path(row.get("image") or row.get("video") or row["path"])
        items.append(ImageItem(str(row.get("id", path.as_posix())), str(source.parent / path)))
      except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(
          f"{source}:{n}: expected a JSON object with 'image' (or 'video' / 'path') and optionally 'id' ({e!r})"
        ) from None
  elif source.is_file():
    items = [ImageItem(line.strip(), line.strip()) for line in source.read_text().splitlines() if line.strip()]
  else:
    raise FileNotFoundError(
      f"--images {source} does not exist; pass a folder of images, a .jsonl manifest or a .txt list of paths"
    )
  items.sort(key=lambda it: it.id)
  for a, b in zip(items, items[1:]):
    if a.id == b.id:
      raise ValueError(f"image id {a.id!r} appears twice in {source}; ids must be unique")
  return items


def shard_paths(
  out: str | os.PathLike, errors: str | os.PathLike | None, index: int, count: int
) -> tuple[pathlib.Path, pathlib.Path]:
  """This process's captions and errors files."""
  out = pathlib.Path(out)
  if count > 1:
    out = out.with_name(f"{out.stem}-{index:05d}-of-{count:05d}{out.suffix}")
  return out, pathlib.Path(errors) if errors else out.with_name(f"{out.stem}.errors.jsonl")


def finished_ids(path: pathlib.Path) -> set[str]:
  """Ids already written to a JSONL file; a torn final line (no newline: the writer was killed) is cut off."""
  if not path.exists():
    return set()
  data = path.read_bytes()
  if data and not data.endswith(b"\n"):
    keep = data.rfind(b"\n") + 1
    with open(path, "r+b") as f:
      f.truncate(keep)
    data = data[:keep]
  ids = set()
  for n, line in enumerate(data.decode().splitlines(), 1):
    if line.strip():
      try:
        ids.add(json.loads(line)["id"])
      except (json.JSONDecodeError, KeyError) as e:
        raise ValueError(f"{path}:{n} is not a jaxcap.caption line ({e!r}); move the file away or fix the line")
  return ids


class DiskFullError(OSError):
  """No space left for a write of `needed` bytes to `path` (`free` bytes left on its filesystem)."""

  def __init__(self, path: pathlib.Path, needed: int, free: int | None):
    self.path, self.needed, self.free = path, needed, free
    left = f", {free} bytes free" if free is not None else ""
    super().__init__(
      errno.ENOSPC,
      f"no space left on the device writing {path}: {needed} bytes needed for this batch{left}. Free some space "
      "and rerun the same command: the lines written are kept and the run resumes after them",
    )

  def __str__(self) -> str:
    return self.strerror


def append_lines(path: pathlib.Path, rows: Sequence[dict]) -> None:
  """Appends rows in one write and syncs, so a kill leaves at most one torn final line; a full disk is a
  DiskFullError naming the file and the bytes it needed."""
  if rows:
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    try:
      with open(path, "a") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    except OSError as e:
      if e.errno not in (errno.ENOSPC, errno.EDQUOT):
        raise
      try:
        free = shutil.disk_usage(path.parent).free
      except OSError:
        free = None
      raise DiskFullError(path, len(data.encode()), free) from None


def media_grid(item: ImageItem, processor) -> tuple[int, int, int]:
  """(t, h, w) in patches of an image or video as processed, from its file header (frames sampled for a video)."""
  from jaxcap.processing import is_video_file, read_image_size, video_file_grid

  if is_video_file(item.path):
    return tuple(int(n) for n in video_file_grid(item.path, processor.video_cfg, record=item.id))
  h, w = read_image_size(item.path, processor.vision_cfg.max_image_pixels, record=item.id)
  return tuple(int(n) for n in processor.vision_cfg.grid(h, w))


def sort_by_size(items: Iterable[ImageItem], processor) -> tuple[list[ImageItem], list[dict]]:
  """Images and videos ordered by their processed size (patches), reading only file headers (EXIF rotation
  applied), so each batch mixes sizes that pad little; returns (items, error rows)."""
  sized, errors = [], []
  for item in items:
    try:
      patches = int(np.prod(media_grid(item, processor)))
    except Exception as e:  # any unreadable file is reported, never fatal
      errors.append({"id": item.id, "image": item.path, "error": f"cannot read: {e}"})
      continue
    sized.append((patches, item))
  return [item for _, item in sorted(sized, key=lambda x: x[0])], errors


def load_images(items: Sequence[ImageItem], processor) -> tuple[list[tuple[ImageItem, dict]], list[dict]]:
  """Fully decodes each image, or samples each video's frames (a truncated file fails here, not inside the batch):
  (item, its conversation content item) pairs and error rows."""
  from jaxcap.processing import is_video_file, load_image, read_video

  ok, errors = [], []
  for item in items:
    try:
      if is_video_file(item.path):
        clip = read_video(item.path, processor.video_cfg, resize=True, record=item.id)
        ok.append((item, {"type": "video", "video": clip}))
      else:
        image = load_image(item.path, processor.vision_cfg.max_image_pixels, record=item.id)
        image.load()
        ok.append((item, {"type": "image", "image": image}))
    except Exception as e:
      errors.append({"id": item.id, "image": item.path, "error": str(e)})
  return ok, errors


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  ap = argparse.ArgumentParser(
    prog="python -m jaxcap.caption",
    description=__doc__.split("\n\n")[0],
    formatter_class=argparse.RawDescriptionHelpFormatter,
    epilog=__doc__,
  )
  ap.add_argument("--checkpoint", required=True, help="local HF Qwen2.5-VL checkpoint directory (with tokenizer)")
  ap.add_argument("--images", required=True, help="image folder, .jsonl manifest or .txt list of paths")
  ap.add_argument("--out", required=True, help="captions JSONL (appended to; resumable)")
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
  ap.add_argument("--process_index", type=int, default=None, help="default: jax.process_index()")
  ap.add_argument("--process_count", type=int, default=None, help="default: jax.process_count()")
  ap.add_argument("--no_progress", action="store_true", help="no progress bar")
  ap.add_argument(
    "--engine", choices=("static", "paged"), default="static", help="paged: decode slots refilled as captions end"
  )
  ap.add_argument("--slots", type=int, default=None, help="paged engine: decode slots (default: --batch_size)")
  ap.add_argument("--page_size", type=int, default=16, help="paged engine: tokens per KV-cache page")
  ap.add_argument("--segment_steps", type=int, default=32, help="paged engine: decode steps between refills")
  args = ap.parse_args(argv)
  if args.batch_size < 1:
    ap.error(f"--batch_size={args.batch_size}; use at least 1")
  return args


def main(argv: Sequence[str] | None = None) -> int:
  from jaxcap.sampling.footprint import MemoryShortError

  try:
    return annotate(parse_args(argv))
  except DiskFullError as e:  # one line: the output written so far is whole and the rerun resumes after it
    print(f"error: {e}", file=sys.stderr, flush=True)
    return 1
  except MemoryShortError as e:  # the memory check, before loading: one line with the numbers and the fix
    print(f"error: {e}", file=sys.stderr, flush=True)
    return 2


def annotate(args: argparse.Namespace) -> int:
  """Captions every pending image of `args` (parse_args); 0 when done."""
  import jax
  from tqdm import tqdm
  from jaxcap.checkpoint import checkpoint_dtype, load_hf_checkpoint, read_config
  from jaxcap.processing import Processor
  from jaxcap.sampling import Sampler, SamplingConfig
  from jaxcap.sharding import make_mesh

  index = jax.process_index() if args.process_index is None else args.process_index
  count = jax.process_count() if args.process_count is None else args.process_count
  if not 0 <= index < count:
    raise SystemExit(f"--process_index={index} is outside [0, --process_count={count})")
  out_path, err_path = shard_paths(args.out, args.errors, index, count)
  out_path.parent.mkdir(parents=True, exist_ok=True)
  from jaxcap.locking import lock_output

  lock = lock_output(out_path)  # noqa: F841  (held until main returns: one writer per output file)
  done = finished_ids(out_path) | finished_ids(err_path)
  mine = list_images(args.images)[index::count]
  pending = [it for it in mine if it.id not in done]
  print(
    f"jaxcap.caption: process {index}/{count}: {len(mine)} images, {len(mine) - len(pending)} already done, "
    f"{len(pending)} to caption -> {out_path}",
    file=sys.stderr,
  )
  if not pending:
    return 0

  # Data parallel over this process's devices; other processes work on other images, no collectives needed.
  # (the paged engine decodes on one device for now)
  mesh = make_mesh({"data": -1}, devices=jax.local_devices()[: 1 if args.engine == "paged" else None])
  processor = Processor.from_pretrained(args.checkpoint)  # the checkpoint's pixel budget, as transformers
  budget = {k: getattr(args, k) for k in ("min_pixels", "max_pixels") if getattr(args, k) is not None}
  processor.vision_cfg = dataclasses.replace(processor.vision_cfg, **budget)
  sampling = SamplingConfig(
    temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, max_new_tokens=args.max_new_tokens
  )
  ordered, errors = sort_by_size(pending, processor)
  append_lines(err_path, errors)
  param_dtype = checkpoint_dtype(args.checkpoint, args.dtype)
  if ordered:
    with jax.set_mesh(mesh):  # the decode layout the check counts depends on the mesh
      check_memory(args, read_config(args.checkpoint, dtype=param_dtype, param_dtype=param_dtype), ordered, processor)
  bar = tqdm(total=len(pending), unit="img", disable=args.no_progress, dynamic_ncols=True)
  bar.update(len(errors))
  n_errors = len(errors)
  with jax.set_mesh(mesh):
    model = load_hf_checkpoint(args.checkpoint, mesh=mesh, param_dtype=param_dtype)
    if args.engine == "paged":
      from jaxcap.sampling.engine import EngineConfig, PagedSampler

      engine = EngineConfig(args.slots or args.batch_size, args.page_size, args.segment_steps)
      sampler = PagedSampler(model, processor=processor, sampling=sampling, engine=engine)
    else:
      sampler = Sampler(model, processor=processor, sampling=sampling)
    for start in range(0, len(ordered), args.batch_size):
      loaded, bad = load_images(ordered[start : start + args.batch_size], processor)
      append_lines(err_path, bad)
      rows = []
      if loaded:
        conversations = [
          [{"role": "user", "content": [media, {"type": "text", "text": args.prompt}]}] for _, media in loaded
        ]
        key = jax.random.fold_in(jax.random.key(args.seed), zlib.crc32(loaded[0][0].id.encode()))
        result = sampler(conversations, key)
        tokens, lengths = jax.device_get((result.tokens, result.lengths))
        stops = set(sampling.resolve_stop_ids(processor.cfg.eos_token_id))
        for (item, _), text, row_tokens, n in zip(loaded, result.text, tokens, lengths):
          stopped = int(row_tokens[n - 1]) in stops
          rows.append(
            {"id": item.id, "image": item.path, "caption": text, "tokens": int(n) - stopped, "truncated": not stopped}
          )
        append_lines(out_path, rows)
      n_errors += len(bad)
      bar.update(len(loaded) + len(bad))
      bar.set_postfix(errors=n_errors, refresh=False)
  bar.close()
  return 0


def check_memory(args: argparse.Namespace, cfg, ordered: Sequence[ImageItem], processor) -> None:
  """Raises footprint.MemoryShortError before anything is loaded when the run's estimated peak (its
  largest batch: the last, as `ordered` is by size) exceeds the memory available; on CPU, or anywhere with
  JAXCAP_MEMORY_BUDGET set."""
  import jax

  from jaxcap.host_memory import BUDGET, available_memory
  from jaxcap.sampling.footprint import check_fits

  if jax.default_backend() != "cpu" and not os.environ.get(BUDGET):
    return  # the weights live on the accelerators, not in host memory
  t, h, w = media_grid(ordered[-1], processor)
  patches = t * h * w
  text = len(args.prompt.encode()) + 32  # the prompt's tokens (at most its bytes) and the chat template's
  check_fits(
    cfg,
    available_memory(),
    rows=min(args.batch_size, len(ordered)),
    prompt_tokens=patches // cfg.vision.spatial_merge_size**2 + text,
    max_new_tokens=args.max_new_tokens,
    vision_patches=patches,
    vision_segment=h * w,
    what="jaxcap.caption",
  )


if __name__ == "__main__":
  from jaxcap.host_memory import retain_on_cpu

  retain_on_cpu()
  sys.exit(main())
