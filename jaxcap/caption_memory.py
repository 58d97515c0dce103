"""The annotator's memory check, before anything is loaded or computed: its peak (bytes) counted from what it will
allocate, and a one-line refusal with the numbers and the flags that would fit when the machine cannot hold it.

It counts `sampling_footprint`'s params, decode layout, KV cache (`--batch_size` rows, or the paged engine's
`--slots`) and decoder activations, with the vision tower's prefill in place of its activations where larger: the
tower runs over a whole batch's images in one pack, padded as the sampler pads it (rows to a power of two, the
last row's images repeated; the pack to its bucketed `LayoutShape`), and its full-attention blocks hold float32
scores [frames, heads, frame_len, frame_len]: XLA:CPU keeps three such buffers at once (the scores, the masked
scores and the probabilities: the compiled tower's temporary memory is 3.0-3.1x the scores, 1k-8k-patch frames),
so a 1536 x 1024 photo at the default pixel budget (4,988 patches, padded to 8,192) costs 3 GiB per image per
head group of 4. Only the largest batches are sized: the images are ordered by size, so they are the last two.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, Sequence

import numpy as np

from jaxcap.buckets import batch_bucket
from jaxcap.data.annotation_files import ImageItem
from jaxcap.data.records import is_video_file
from jaxcap.host_memory import BUDGET, available_memory
from jaxcap.models.families import layout_shape_for
from jaxcap.processing.annotation_media import media_grid
from jaxcap.sampling.footprint import GIB, Footprint, MemoryShortError, sampling_footprint

# XLA:CPU's live copies of a full-attention block's float32 scores (see the module docstring)
SCORE_COPIES = 3


# the chat template's tokens around the prompt and the image (system turn, roles, vision markers), at most
TEMPLATE_TOKENS = 32


@dataclasses.dataclass(frozen=True)
class Plan:
  """What the annotator runs: `rows` prompts per program (the KV cache's rows), images `batch_size` to a vision
  pack, at most `max_new_tokens` new tokens after a prompt of `text_tokens` text tokens."""

  rows: int
  batch_size: int
  max_new_tokens: int
  text_tokens: int


def vision_bytes(cfg, grids: Sequence[tuple[int, int, int]]) -> int:
  """Peak bytes of the vision tower over one pack of images / videos of `grids` ((t, h, w) in patches, every padded
  row's included), padded to its bucketed layout: the attention scores' live copies and the MLP's activations."""
  v = cfg.vision
  shape = layout_shape_for(np.asarray(grids, np.int64).reshape(-1, 3), v).bucketed(v)
  # both attention kinds' scores: XLA's buffer assignment need not reuse the window blocks' for the full ones
  scores = (shape.frames * shape.frame_len**2 + shape.windows * shape.window_len**2) * v.num_heads * 4
  return SCORE_COPIES * scores + shape.patches * (4 * v.hidden_size + 2 * v.intermediate_size) * 4


def padded_pack(grids: list[tuple[int, int, int]], videos: bool) -> list[tuple[int, int, int]]:
  """A batch's vision pack as the sampler pads it: rows to a power of two, each extra row repeating the last row's
  image (a batch with videos pads with text-only rows)."""
  return grids if videos else grids + grids[-1:] * (batch_bucket(len(grids)) - len(grids))


def last_batches(n: int, batch_size: int) -> list[slice]:
  """The last two batches of `n` items in batches of `batch_size` (the last may be short)."""
  last = (n - 1) // batch_size * batch_size
  return [slice(s, s + batch_size) for s in (last - batch_size, last) if s >= 0]


def footprint(
  cfg, plan: Plan, grids: Sequence[tuple[int, int, int]], videos: Sequence[bool], total: int
) -> tuple[Footprint, int]:
  """(the annotator's footprint, where its largest batch starts in `grids`) for the last `len(grids)` of `total`
  items in the order they are captioned (by size; at least the last two batches); the vision tower's prefill
  stands for the activations where it is the larger."""
  merge = cfg.vision.spatial_merge_size**2
  longest = max(int(np.prod(g)) for g in grids)
  fp = sampling_footprint(cfg, plan.rows, longest // merge + plan.text_tokens, plan.max_new_tokens, 0)
  offset = total - len(grids)  # batches start at multiples of batch_size in the whole list
  batches = [slice(s.start - offset, s.stop - offset) for s in last_batches(total, plan.batch_size)]
  tower, where = max((vision_bytes(cfg, padded_pack(list(grids[s]), any(videos[s]))), s.start) for s in batches)
  return dataclasses.replace(fp, activations=max(fp.activations, tower)), where


def check_annotation_memory(
  cfg,
  plan: Plan,
  items: Sequence[ImageItem],
  processor,
  *,
  rows_flag: str = "--batch_size",
  available: tuple[int, str] | None | Callable[[], tuple[int, str] | None] = available_memory,
) -> Footprint | None:
  """The annotator's estimated peak for `items` (ordered by size, as captioned) under `plan`; raises
  footprint.MemoryShortError (one line: the estimate by part, the largest batch, the memory available and the
  flags that would each fit: `--dtype bfloat16`, a smaller `rows_flag`, a smaller `--max_pixels`) when it exceeds the
  memory available. Checked on CPU, or anywhere with JAXCAP_MEMORY_BUDGET set (elsewhere the weights live on the
  accelerators: None)."""
  import jax
  import jax.numpy as jnp

  if jax.default_backend() != "cpu" and not os.environ.get(BUDGET):
    return None
  tail = list(items[-2 * plan.batch_size :])  # the largest items: every batch sized below is among them
  videos = [is_video_file(it.path) for it in tail]
  sizes = [None if v else _image_size(it, processor) for it, v in zip(tail, videos)]
  fixed = {i: media_grid(it, processor) for i, (it, v) in enumerate(zip(tail, videos)) if v}

  def grids(vision_cfg):
    return [fixed[i] if videos[i] else (1, *vision_cfg.grid(*sizes[i])[1:]) for i in range(len(tail))]

  def size(c, p, vision_cfg=processor.vision_cfg):
    return footprint(c, p, grids(vision_cfg), videos, len(items))

  need, where = size(cfg, plan)
  available = available() if callable(available) else available
  if available is None or need.total <= available[0]:
    return need
  budget, source = available
  fits = lambda c, p, vc=processor.vision_cfg: size(c, p, vc)[0].total <= budget
  fixes = []
  if np.dtype(cfg.param_dtype) != np.dtype(jnp.bfloat16):
    bf16 = cfg.replace(param_dtype=jnp.bfloat16, dtype=jnp.bfloat16)
    if fits(bf16, plan):  # not always smaller on CPU: the decode loop's float32 copies of bf16 weights
      fixes.append(f"--dtype bfloat16 ({size(bf16, plan)[0].total / GIB:.2f} GiB)")
  rows = plan.rows if rows_flag == "--slots" else plan.batch_size
  for smaller in [rows >> k for k in range(1, rows.bit_length()) if rows >> k]:
    p = dataclasses.replace(plan, rows=smaller) if rows_flag == "--slots" else _with_batch(plan, smaller)
    if fits(cfg, p):
      fixes.append(f"{rows_flag} {smaller} ({size(cfg, p)[0].total / GIB:.2f} GiB)")
      break
  pixels = _smaller_budget(processor.vision_cfg, lambda vc: fits(cfg, plan, vc)) if not all(videos) else None
  if pixels is not None:
    vc = _budget(processor.vision_cfg, pixels)
    fixes.append(f"--max_pixels {pixels} ({size(cfg, plan, vc)[0].total / GIB:.2f} GiB)")
  fixes.append("a machine with more memory")
  t, h, w = max(grids(processor.vision_cfg)[where : where + plan.batch_size], key=np.prod)
  patch = cfg.vision.patch_size
  largest = f"{'frames' if t > 1 else 'images'} of up to {h * patch}x{w * patch} px after resizing: {t * h * w} patches"
  raise MemoryShortError(
    f"jaxcap.caption needs about {need.describe(np.dtype(cfg.param_dtype).name)} for its largest batch of "
    f"{min(plan.batch_size, len(items))} ({largest}), but {budget / GIB:.2f} GiB is available ({source}); use "
    f"{' or '.join(fixes)}, or set {BUDGET}=off to skip this check"
  )


def check_flags(args, cfg, ordered: Sequence[ImageItem], processor) -> None:
  """`check_annotation_memory` for the annotator's flags `args` (`jaxcap.caption.parse_args`): raises
  MemoryShortError, before anything is loaded, when the run's largest batch would not fit (the paged engine's KV
  cache: `--slots` rows)."""
  paged = args.engine == "paged"
  plan = Plan(
    rows=min((args.slots or args.batch_size) if paged else args.batch_size, len(ordered)),
    batch_size=args.batch_size,
    max_new_tokens=args.max_new_tokens,
    text_tokens=len(args.prompt.encode()) + TEMPLATE_TOKENS,  # the prompt's tokens are at most its bytes
  )
  check_annotation_memory(cfg, plan, ordered, processor, rows_flag="--slots" if paged else "--batch_size")


def out_of_memory(error: BaseException) -> bool:
  """Whether `error` is XLA's failure to allocate (RESOURCE_EXHAUSTED on accelerators, "Out of memory" on CPU)."""
  return type(error).__name__ in ("JaxRuntimeError", "XlaRuntimeError") and (
    "RESOURCE_EXHAUSTED" in str(error) or "Out of memory" in str(error)
  )


def _image_size(item: ImageItem, processor) -> tuple[int, int]:
  from jaxcap.processing import read_image_size

  return read_image_size(item.path, processor.vision_cfg.max_image_pixels, record=item.id)


def _with_batch(plan: Plan, batch_size: int) -> Plan:
  return dataclasses.replace(plan, batch_size=batch_size, rows=min(plan.rows, batch_size))


def _budget(vision_cfg, max_pixels: int):
  return dataclasses.replace(vision_cfg, max_pixels=max_pixels, min_pixels=min(vision_cfg.min_pixels, max_pixels))


def _smaller_budget(vision_cfg, fits: Callable) -> int | None:
  """The largest pixel budget, halving from `vision_cfg`'s down to one merged token (a multiple of 28^2 for
  Qwen2.5-VL), under which `fits(vision_cfg)`; None when none does."""
  unit = vision_cfg.factor**2
  budget = vision_cfg.max_pixels // 2 // unit * unit
  while budget >= unit:
    if fits(_budget(vision_cfg, budget)):
      return budget
    budget = budget // 2 // unit * unit
  return None
