"""An RL (or SFT) step's packed inputs (`rl.micro_batch_tokens` > 0): the packed micro-batches of its (prompt,
completion) sequences from the sampler's host batch and the rollout's lengths, and the step's vision pack on device;
whether the step runs them or its padded layout (`packing_metrics`).

The update's prompts [M0, b, P] flattened are the sampler batch's real rows in order (one process), and its
rollouts [M0, b*G, C] flattened are row * G + g, so `jaxcap.train.packing.rows.pack` indexes both directly. Only the
prompts' ids and masks, the vision items and the completions' lengths are read on the host.
"""

from __future__ import annotations

import numpy as np

from jaxcap.models.families import family_of_config
from jaxcap.models.flops import padded_pass_counts
from jaxcap.models.packed_attention import fused_platform
from jaxcap.sampling.prompts import VisionItems
from jaxcap.sampling.sampler import SamplerBatch
from jaxcap.train.packing.inputs import PackedInputs
from jaxcap.train.packing.rows import PackedRows, VisionItem, pack, packing_pays


def vision_items(items: VisionItems, input_ids: np.ndarray, cfg, real_rows: int) -> list[VisionItem]:
  """A sampler pack's items (images then videos, pack order) -> `VisionItem`s of its first `real_rows` prompts,
  each with its first patch in the pack. Which items are videos follows from the ids' video placeholder count
  (videos are packed after all images)."""
  grids = np.asarray(items.grid_thw).reshape(-1, 3)
  sizes = np.prod(grids, -1)
  starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
  video_tokens = int(np.sum(np.asarray(input_ids) == cfg.video_token_id))
  tokens = sizes // cfg.vision.spatial_merge_size**2
  from_end = np.cumsum(tokens[::-1])[::-1]  # tokens of this item and every later one
  video = (from_end <= video_tokens) & (video_tokens > 0)
  return [
    VisionItem(int(r), bool(v), tuple(int(x) for x in g), int(s))
    for r, v, g, s in zip(items.rows, video, grids, starts)
    if r < real_rows
  ]


def packed_inputs(
  host: SamplerBatch,
  placed: SamplerBatch,
  lengths: np.ndarray,
  completion_len: int,
  budget: int,
  cfg,
  steps: int,
) -> PackedInputs:
  """The step's `PackedInputs`: `host` the sampler's bucketed batch (numpy, one process), `placed` the same on
  device (its vision pack is the step's pixels), `lengths` [rows * G] each completion's tokens (the stop token
  included), `completion_len` C of the rollout arrays, `budget` = `rl.micro_batch_tokens`, `cfg` the model's
  config, `steps` the bucket ladder's steps per octave."""
  return with_pixels(placed, packed_rows(host, lengths, completion_len, budget, cfg, steps))


def shares_prompts(cfg, group: int) -> bool:
  """Whether packed rows lay each prompt out once for its completions (`pack(..., share=True)`): the model shares
  prompts (`model.share_prompt`), G > 1, and the packed attention runs the jnp paths (the fused kernels of TPU / GPU
  read segment ids only, so there the rows repeat each prompt and keep the kernel), and the family's decoder can
  (`Family.packs_shared_prompts`)."""
  shared = bool(cfg.share_prompt) and group > 1 and fused_platform() is None
  return shared and family_of_config(cfg).packs_shared_prompts


def packed_rows(host: SamplerBatch, lengths: np.ndarray, completion_len: int, budget: int, cfg, steps: int):
  """`packed_inputs`' rows alone (host numpy: what the step decides packed vs padded on, `packing_pays`)."""
  p, rows = host.prompts, host.rows
  ids, mask = np.asarray(p.input_ids)[:rows], np.asarray(p.attention_mask)[:rows]
  cmask = np.arange(completion_len)[None] < np.asarray(lengths).reshape(-1)[:, None]
  items = []
  if host.packs:
    (items_,) = host.packs  # one process
    items = vision_items(items_, p.input_ids, cfg, rows)
  return pack(
    ids,
    mask,
    cmask,
    budget,
    image_token_id=cfg.image_token_id,
    video_token_id=cfg.video_token_id,
    items=items,
    vision_cfg=cfg.vision,
    steps=steps,
    share=shares_prompts(cfg, len(cmask) // rows),
  )


def packing_metrics(
  rows: PackedRows,
  host: SamplerBatch,
  lengths: np.ndarray,
  completion_len: int,
  micro_batches: int,
  budget: int,
  min_saving: float,
  cfg,
) -> tuple[dict[str, float], bool]:
  """(packing/* metrics, whether the step runs packed) of a step with packed `rows` of `host`'s prompts and
  completions of `lengths` [rows * G]; its padded layout is `micro_batches` slices of rows P + `completion_len` wide;
  `cfg` the model's config (`packing_pays`). packing/packed 1 or 0; packing/saving the share of the padded pass's
  decoder FLOPs packing saves (whichever ran; against a prompt-shared padded pass, `cfg.share_prompt`, it can be
  negative, as where the packed rows repeat each prompt: `shares_prompts`); packing/padding_share the share of the decoder's token
  slots holding no token in the layout that runs (a shared prompt's tokens counted once); packing/micro_batches its
  micro-batch count."""
  lengths = np.asarray(lengths).reshape(-1)
  p_len = host.prompts.input_ids.shape[1]
  shape = (len(lengths), p_len, completion_len)
  group = len(lengths) // host.rows
  shared = host.rows if cfg.share_prompt and group > 1 else None  # the padded pass runs each prompt once
  packed, saving = packing_pays(rows, shape, micro_batches, budget, min_saving, cfg.text, shared)
  if packed:
    share, micro = rows.padding_share(), rows.shape[0]
  else:
    prompt_tokens = int(np.asarray(host.prompts.attention_mask)[: host.rows].sum())
    real = (1 if shared else group) * prompt_tokens + int(lengths.sum())
    slots = padded_pass_counts(len(lengths), p_len, completion_len, shared)["slots"]
    share, micro = 1.0 - real / slots, micro_batches
  metrics = {"packing/packed": float(packed), "packing/saving": saving, "packing/padding_share": share}
  return {**metrics, "packing/micro_batches": float(micro)}, packed


def with_pixels(placed: SamplerBatch, rows: PackedRows) -> PackedInputs:
  """`rows` with the step's pixels: the placed batch's vision pack (None without vision)."""
  pixels = None if placed.prompts.vision is None else placed.prompts.vision.pixel_values
  return PackedInputs(pixels, rows)


def planned_rows(
  num_prompts: int, group: int, prompt_len: int, completion_len: int, grid, budget: int, cfg, steps: int
) -> PackedRows:
  """The packed micro-batches of the step `jaxcap.plan` plans (host numpy): `num_prompts` prompts of `prompt_len`
  tokens, each with one image of `grid` (t, h, w patches; None: text only) and `group` completions of
  `completion_len` tokens, every sequence at its longest, so each micro-batch is as full as the budget lets it."""
  vision_tokens = 0 if grid is None else int(np.prod(grid)) // cfg.vision.spatial_merge_size**2
  ids = np.zeros((num_prompts, prompt_len), np.int32)
  ids[:, :vision_tokens] = cfg.image_token_id
  items = (
    [] if grid is None else [VisionItem(i, False, tuple(grid), i * int(np.prod(grid))) for i in range(num_prompts)]
  )
  mask = np.ones((num_prompts, prompt_len), bool)
  cmask = np.ones((num_prompts * group, completion_len), bool)
  return pack(
    ids, mask, cmask, budget, image_token_id=cfg.image_token_id, video_token_id=cfg.video_token_id, items=items,
    vision_cfg=cfg.vision, steps=steps, share=shares_prompts(cfg, group),
  )  # fmt: skip
