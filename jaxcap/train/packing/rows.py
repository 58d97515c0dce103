"""Packed micro-batches (host side, numpy): a step's (prompt, completion) sequences laid end to end in rows of a
token budget, with segment ids, instead of every sequence padded to the longest prompt plus the longest completion.

A step's sequences are N = Np * G: sequence n is completion n of prompt n // G (the padded layout's flattened
order). Which micro-batch and row each sequence takes, and the row length, is `jaxcap.train.packing.assignment`'s
(first-fit decreasing, each prompt's G sequences in one micro-batch, so it embeds its prompts' images once). At
most `budget // row_len` rows per micro-batch (fewer when the step uses fewer: the most any micro-batch uses, up the
ladder); micro-batch count, rows, sequence slots and target count are rounded up the same `jaxcap.buckets.ladder`,
so a stream of steps compiles a handful of programs.

The device side (`jaxcap.train.packing.inputs`) gathers every packed array from the step's padded arrays through these
indexes: only lengths and vision items are read on the host.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import numpy as np

from jaxcap.buckets import DEFAULT_STEPS, ladder
from jaxcap.models.families import layout_for, layout_shape_for
from jaxcap.models.flops import decoder_pass_flops, padded_pass_counts
from jaxcap.models.segment_attention import SegmentWindow, segment_window
from jaxcap.models.vision import VisionLayout, stack_layouts
from jaxcap.train.packing.assignment import assign


@dataclasses.dataclass(frozen=True)
class VisionItem:
  """One image or video of a step: its prompt, kind, grid (t, h, w patches) and first patch in the step's pixels."""

  prompt: int
  video: bool
  grid: tuple[int, int, int]
  start: int


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PackedRows:
  """M packed micro-batches of R rows of L tokens, S sequence slots and K target slots each.

  source int32 [M, R, L]: each slot's token in the step's token source, prompt ids [Np * P] then completions
    [N * C] flattened (padding slots: 0); segments int32 [M, R, L]: 1, 2, ... per sequence of a row, 0 padding;
    feature int32 [M, R, L]: a vision token's row in its micro-batch's vision features, -1 elsewhere.
  target_index int32 [M, K]: the slot (flat in R * L) whose hidden state predicts target k (its token is the next
    slot's); target_dest int32 [M, K]: where target k's log-prob lands in the micro-batch's [S, C] completions
    (flat; S * C for padding, dropped).
  seq_index int32 [M, S]: each slot's sequence in the step (0 for padding); seq_valid bool [M, S].
  pixel_index int32 [M, Lpix]: each micro-batch's vision pack from the step's pixels (padding: patch 0);
    layout: the packs' VisionLayouts [M, ...]. Both None without vision.
  window: static, the decoder's attention window, holding the longest sequence (`jaxcap.models.segment_attention`);
    None: dense attention over the row.
  parents int32 [M, R, L] (rows that share prompts, `pack(..., share=True)`): the segment each slot also reads, its
    group's prompt for a completion's slots (its own segment elsewhere); None: every sequence is one segment.
  target_source int32 [M, K]: target k's token in the step's token source (with a shared prompt, the slot after
    the prompt's last holds only its first completion's first token; padding: 0)."""

  source: np.ndarray
  segments: np.ndarray
  feature: np.ndarray
  target_index: np.ndarray
  target_dest: np.ndarray
  seq_index: np.ndarray
  seq_valid: np.ndarray
  pixel_index: np.ndarray | None = None
  layout: VisionLayout | None = None
  window: SegmentWindow | None = dataclasses.field(default=None, metadata=dict(static=True))
  parents: np.ndarray | None = None
  target_source: np.ndarray | None = None

  @property
  def shape(self) -> tuple[int, int, int]:
    """(micro-batches, rows, row length)."""
    return tuple(self.source.shape)

  def padding_share(self) -> float:
    """The share of row slots holding no token."""
    return float(np.mean(self.segments == 0))


def packing_pays(
  rows: PackedRows,
  padded_shape: tuple[int, int, int],
  micro_batches: int,
  budget: int,
  min_saving: float,
  text_cfg,
  shared_prompts: int | None = None,
) -> tuple[bool, float]:
  """(whether a step runs its packed `rows` rather than its padded layout, the share of the padded pass's decoder
  FLOPs packing saves). `padded_shape` = (sequences, prompt width, completion width) in `micro_batches` slices;
  FLOPs as `jaxcap.models.flops.decoder_pass_flops` counts them for `text_cfg`: token slots through the layers,
  LM-head positions (padded: every completion slot; packed: the K targets) and attention pairs (padded rows dense;
  packed rows their key window). Packed, unless packing saves less than `min_saving` and a padded slice fits the
  token `budget` too (the budget bounds memory: a run that set it cannot fall back to slices larger than it). A
  packed slot costs more than its FLOPs (gathers, the window's scatter in the backward), so a few percent saved
  runs slower (uniform lengths); `min_saving` < 0: always packed. `shared_prompts`: the padded pass runs each of
  that many prompts once for its completions (`model.share_prompt`), which it counts so (`padded_pass_counts`)."""
  sequences, prompt, completion = padded_shape
  width = prompt + completion
  padded = decoder_pass_flops(text_cfg, **padded_pass_counts(sequences, prompt, completion, shared_prompts))
  keys = rows.shape[2] if rows.window is None else rows.window.blocks * rows.window.block
  packed = decoder_pass_flops(
    text_cfg, slots=rows.source.size, head_positions=rows.target_index.size, attention_pairs=rows.source.size * keys
  )
  saving = 1.0 - packed / padded
  if min_saving < 0 or -(-sequences // micro_batches) * width > budget:
    return True, saving
  return saving >= min_saving, saving


def pack(
  prompt_ids: np.ndarray,
  prompt_mask: np.ndarray,
  completion_mask: np.ndarray,
  budget: int,
  *,
  image_token_id: int,
  video_token_id: int,
  items: Sequence[VisionItem] = (),
  vision_cfg=None,
  steps: int = DEFAULT_STEPS,
  share: bool = False,
) -> PackedRows:
  """The packed micro-batches of a step. prompt_ids / prompt_mask [Np, P] (any padding side), completion_mask bool
  [N, C] (True on a completion's tokens, a prefix of each row), N = Np * G; `budget`: tokens per micro-batch
  (`rl.micro_batch_tokens`); `items`: the step's vision items in prompt order (images and videos interleaved as
  the prompts hold them), with `vision_cfg` (the model's VisionConfig). `share`: a prompt is laid out once, as its
  own segment, followed by as many of its completions as fit the row, each a segment reading the prompt's
  (`parents`); otherwise each (prompt, completion) is one segment."""
  prompt_ids, prompt_mask = np.asarray(prompt_ids), np.asarray(prompt_mask, bool)
  completion_mask = np.asarray(completion_mask, bool)
  num_prompts, p_len = prompt_ids.shape
  n_seqs, c_len = completion_mask.shape
  if n_seqs % num_prompts:
    raise ValueError(f"{n_seqs} completions for {num_prompts} prompts: give G completions per prompt")
  g = n_seqs // num_prompts
  comp_lens = completion_mask.sum(1)
  if np.any(completion_mask != (np.arange(c_len) < comp_lens[:, None])):
    raise ValueError("completion_mask must be a prefix of each row (tokens up to the completion's length)")
  prompt_lens = prompt_mask.sum(1)
  row_len, rows, micros = assign(prompt_lens, comp_lens, g, budget, steps, share)
  # first-fit fills the lowest rows first: a step smaller than the budget computes only the rows it uses (laddered)
  rows = min(rows, ladder(max(r for mb in micros for _, r in mb) + 1, 1, steps))
  m = ladder(len(micros), 1, steps)
  s = ladder(max(sum(len(unit) for unit, _ in mb) for mb in micros), 1, steps)
  k = ladder(max(int(sum(comp_lens[n] for unit, _ in mb for n in unit)) for mb in micros), 8, steps)
  source = np.zeros((m, rows, row_len), np.int32)
  segments = np.zeros((m, rows, row_len), np.int32)
  parents = np.zeros((m, rows, row_len), np.int32)
  feature = np.full((m, rows, row_len), -1, np.int32)
  target_index = np.zeros((m, k), np.int32)
  target_dest = np.full((m, k), s * c_len, np.int32)
  target_source = np.zeros((m, k), np.int32)
  seq_index = np.zeros((m, s), np.int32)
  seq_valid = np.zeros((m, s), bool)
  by_prompt: dict[int, list[VisionItem]] = {}
  for it in items:
    by_prompt.setdefault(it.prompt, []).append(it)
  packs = []
  for i, mb in enumerate(micros):
    prompts = sorted({unit[0] // g for unit, _ in mb})
    feats, offsets = _feature_offsets([by_prompt.get(p, []) for p in prompts], vision_cfg)
    packs.append(feats)
    fill = [0] * rows
    count = [0] * rows
    targets = slot = 0
    for unit, r in mb:
      p = unit[0] // g
      real = np.flatnonzero(prompt_mask[p])
      start, at = fill[r], fill[r] + len(real)  # the prompt's slots, then its completions'
      prompt_segment = count[r] + 1
      source[i, r, start:at] = p * p_len + real
      segments[i, r, start:at] = parents[i, r, start:at] = prompt_segment
      ids = prompt_ids[p, real]
      img_off, vid_off = offsets[prompts.index(p)]
      is_img, is_vid = ids == image_token_id, ids == video_token_id
      f = np.where(is_img, img_off + np.cumsum(is_img) - 1, np.where(is_vid, vid_off + np.cumsum(is_vid) - 1, -1))
      feature[i, r, start:at] = f
      for j, n in enumerate(unit):
        c = int(comp_lens[n])
        segment = prompt_segment + j + 1 if share else prompt_segment
        source[i, r, at : at + c] = target_source[i, targets : targets + c] = (
          num_prompts * p_len + n * c_len + np.arange(c)
        )
        segments[i, r, at : at + c] = segment
        parents[i, r, at : at + c] = prompt_segment
        # the slot before each completion token: the prompt's last for the first, then the completion's own
        flat = r * row_len + np.concatenate([[start + len(real) - 1], at + np.arange(c - 1)])[:c]
        target_index[i, targets : targets + c] = flat
        target_dest[i, targets : targets + c] = slot * c_len + np.arange(c)
        targets += c
        seq_index[i, slot], seq_valid[i, slot] = n, True
        slot += 1
        at += c
        count[r] = segment
      fill[r] = at
  pixel_index, layout = _vision_packs(packs, m, vision_cfg, steps) if items else (None, None)
  unit_len = lambda unit: int(prompt_lens[unit[0] // g] + sum(comp_lens[n] for n in unit))
  window = segment_window(max(unit_len(unit) for mb in micros for unit, _ in mb), row_len)
  return PackedRows(
    source,
    segments,
    feature,
    target_index,
    target_dest,
    seq_index,
    seq_valid,
    pixel_index,
    layout,
    window,
    parents if share else None,
    target_source,
  )


def _feature_offsets(items_per_prompt, cfg):
  """A micro-batch's vision pack (all its prompts' images, then their videos, in prompt order: as `embed` reads a
  pack) and each prompt's first image / video feature row in it."""
  unit = cfg.spatial_merge_size**2 if cfg is not None else 1
  tokens = lambda it: int(np.prod(it.grid)) // unit
  images = [it for items in items_per_prompt for it in items if not it.video]
  videos = [it for items in items_per_prompt for it in items if it.video]
  n_img = sum(tokens(it) for it in images)
  offsets, img, vid = [], 0, n_img
  for items in items_per_prompt:
    offsets.append((img, vid))
    img += sum(tokens(it) for it in items if not it.video)
    vid += sum(tokens(it) for it in items if it.video)
  return images + videos, offsets


def _vision_packs(packs, m: int, cfg, steps: int):
  """Pixel gather index [M, Lpix] and stacked layouts of each micro-batch's pack (empty ones for padding)."""
  packs = packs + [[] for _ in range(m - len(packs))]
  grids = [np.array([it.grid for it in pack], np.int64).reshape(-1, 3) for pack in packs]
  shape = None
  for grid in grids:
    need = layout_shape_for(grid, cfg).bucketed(cfg, steps)
    shape = need if shape is None else shape.union(need)
  index = np.zeros((m, shape.patches), np.int32)
  for i, pack in enumerate(packs):
    patches = [np.arange(it.start, it.start + int(np.prod(it.grid))) for it in pack]
    if patches:
      flat = np.concatenate(patches)
      index[i, : len(flat)] = flat
  return index, stack_layouts([layout_for(grid, cfg, shape) for grid in grids])
