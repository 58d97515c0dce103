"""Teacher-forced log-probs over packed rows (`jaxcap.train.packing.rows`): the padded pass's values without its padding.

Every packed array is gathered on device from the step's padded arrays: prompts [Np, P] (flattened from the update's
[M, b, P]), completions [N, C], the step's pixels. The decoder sees each row's sequences as independent segments
(causal attention within a segment only, in query blocks over a key window holding the longest sequence:
`rows.window`), each at its own mRoPE positions (the prompt's 3-D ids, then the completion's from the prompt's
largest id + 1, as the padded pass); the LM head runs only at the K slots that predict a completion token.
Log-probs come back in the padded layout, so losses and aggregations are unchanged.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from jaxcap.models.qwen25vl import Qwen25VL
from jaxcap.train.steps.batches import PromptBatch
from jaxcap.train.steps.logprobs import completion_positions, token_logprobs
from jaxcap.train.packing.rows import PackedRows


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PackedInputs:
  """What the packed passes take besides the prompts and tokens: the step's vision pack `pixels` [Lp, patch_dim]
  (None without vision) and its packed micro-batches `rows` [M, ...] (`jaxcap.train.packing.rows.pack`). It stands where
  the padded passes take their micro-batches' VisionLayouts, so the trainer calls either program the same way."""

  pixels: jax.Array | None
  rows: PackedRows


def flat_prompts(prompts: PromptBatch) -> tuple[jax.Array, jax.Array, jax.Array]:
  """A PromptBatch [M, b, ...] -> ids [Np, P], positions [3, Np, P], mask [Np, P] (Np = M * b, prompt order)."""
  m, b, p = prompts.ids.shape
  positions = prompts.positions.transpose(1, 0, 2, 3).reshape(3, m * b, p)
  return prompts.ids.reshape(m * b, p), positions, prompts.mask.reshape(m * b, p)


def token_source(ids, positions, mask, completions):
  """The flat token source packed rows index: ids [Np * P + N * C] and positions [3, Np * P + N * C]."""
  n, c = completions.shape
  g = n // ids.shape[0]
  comp_pos = jnp.repeat(completion_positions(positions, mask, c), g, axis=1)  # [3, N, C]
  flat_ids = jnp.concatenate([ids.reshape(-1), completions.reshape(-1)]).astype(ids.dtype)
  flat_pos = jnp.concatenate([positions.reshape(3, -1), comp_pos.reshape(3, -1)], axis=1)
  return flat_ids, flat_pos


def packed_logprobs(
  model: Qwen25VL, source, rows: PackedRows, pixels, completion_len: int, *, with_entropy: bool = False
):
  """One packed micro-batch (`rows` without its leading M axis) -> log-probs [S, C] (0 off the targets) and, if
  asked, entropies [S, C]. `source`: `token_source(...)`; `pixels`: the step's pixels [Lp, patch_dim] or None."""
  flat_ids, flat_pos = source
  r, length = rows.source.shape
  ids = flat_ids[rows.source]  # [R, L]
  positions = flat_pos[:, rows.source]  # [3, R, L]
  x, deepstack = model.embed_tokens(ids), None
  if rows.pixel_index is not None:
    feats, stack = model.visual_features(pixels[rows.pixel_index], rows.layout)  # [F, D], [n, F, D] or None
    index, is_visual = jnp.clip(rows.feature, 0, feats.shape[0] - 1), (rows.feature >= 0)[..., None]
    x = jnp.where(is_visual, feats.astype(x.dtype)[index], x)
    if stack is not None:  # Qwen3-VL's DeepStack additions at the same slots
      deepstack = jnp.where(is_visual, stack.astype(x.dtype)[:, index], 0).astype(x.dtype)
  real = rows.segments > 0
  hidden, _ = model.decode(
    x,
    jnp.where(real[None], positions, 0),
    real,
    segments=rows.segments,
    deepstack=deepstack,
    segment_window=rows.window,
    segment_parents=rows.parents,
  )
  h = hidden.reshape(r * length, -1)[rows.target_index][None]  # [1, K, D]
  targets = flat_ids[rows.target_source][None]
  lp, ent = token_logprobs(model, h, targets, with_entropy=with_entropy, chunk=model.cfg.logprob_chunk)
  s = rows.seq_index.shape[0]
  back = lambda v: jnp.zeros((s * completion_len,), v.dtype).at[rows.target_dest].set(v[0], mode="drop")
  lp = back(lp).reshape(s, completion_len)
  return lp, (back(ent).reshape(s, completion_len) if with_entropy else None)


def gather_sequences(x: jax.Array, rows: PackedRows) -> jax.Array:
  """A per-sequence array in the update's layout [M0, b*G, ...] -> the packed micro-batches' slots [M, S, ...]."""
  flat = x.reshape(-1, *x.shape[2:])
  return flat[rows.seq_index]


def scatter_sequences(per_slot: jax.Array, rows: PackedRows, like_shape) -> jax.Array:
  """The inverse of `gather_sequences` on valid slots: [M, S, ...] -> the update's layout `like_shape`
  [M0, b*G, ...] (zeros where no slot lands)."""
  n = like_shape[0] * like_shape[1]
  dest = jnp.where(rows.seq_valid, rows.seq_index, n).reshape(-1)
  flat = per_slot.reshape(-1, *per_slot.shape[2:])
  out = jnp.zeros((n, *flat.shape[1:]), flat.dtype).at[dest].set(flat, mode="drop")
  return out.reshape(like_shape)


def packed_sequence_logprobs(graphdef, params, prompts: PromptBatch, packed: PackedInputs, tokens: jax.Array):
  """`jaxcap.train.steps.updates.sequence_logprobs` over packed rows: log-probs [M0, b*G, C] in the padded layout (0 off
  each completion's tokens), one packed micro-batch at a time (no grad). `prompts.pixel_values` is not read."""
  source = token_source(*flat_prompts(prompts), tokens.reshape(-1, tokens.shape[-1]))
  pixels, rows = packed.pixels, packed.rows

  def one(_, mb_rows):
    model = nnx.merge(graphdef, params)
    lp, _ = packed_logprobs(model, source, mb_rows, pixels, tokens.shape[-1])
    return None, lp

  _, out = jax.lax.scan(one, None, rows)
  return scatter_sequences(out, rows, tokens.shape)
