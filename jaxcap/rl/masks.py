"""Two-sided length-conditional reward mask (BalCapRL).

rho = caption length / reference length. Chosen reward dimensions (BalCapRL: the linguistic reward) are kept
only when tau_low <= rho <= tau_high and set to 0 otherwise, so a judge that likes fluent prose cannot be
farmed by captions that are far too short or far too long. Counting words is host-side work on strings
(`caption_lengths`); the mask itself is an array function usable under jit.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Literal, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np

LengthUnit = Literal["words", "tokens"]


@dataclasses.dataclass(frozen=True)
class LengthMaskConfig:
  """Hyper-parameters of the length-conditional mask (defaults from BalCapRL).

  masked_dims: indices of the reward dimensions the mask applies to.
  unit: what a length counts, "words" (whitespace-separated) or "tokens" (tokenizer ids).
  """

  masked_dims: tuple[int, ...] = ()
  tau_low: float = 0.5
  tau_high: float = 2.0
  unit: LengthUnit = "words"

  def __post_init__(self):
    if not 0.0 <= self.tau_low <= self.tau_high:
      raise ValueError(f"need 0 <= tau_low <= tau_high, got {self.tau_low}, {self.tau_high}")
    if self.unit not in ("words", "tokens"):
      raise ValueError(f"unit must be 'words' or 'tokens', got {self.unit!r}")


def caption_lengths(
  captions: Sequence[str], unit: LengthUnit = "words", tokenize: Callable[[str], Sequence[int]] | None = None
) -> np.ndarray:
  """Host-side length of each caption, int32 [len(captions)], in words or tokens.

  Words are whitespace-separated pieces (`str.split()`); tokens need `tokenize` (str -> ids).
  """
  if unit == "words":
    return np.asarray([len(c.split()) for c in captions], dtype=np.int32)
  if unit == "tokens":
    if tokenize is None:
      raise ValueError("unit='tokens' needs a tokenize callable")
    return np.asarray([len(tokenize(c)) for c in captions], dtype=np.int32)
  raise ValueError(f"unit must be 'words' or 'tokens', got {unit!r}")


def length_ratio(lengths: jax.Array, ref_lengths: jax.Array) -> jax.Array:
  """rho = lengths / ref_lengths (float32, same shape after broadcasting); +inf where ref_lengths <= 0."""
  lengths = jnp.asarray(lengths, jnp.float32)
  ref_lengths = jnp.asarray(ref_lengths, jnp.float32)
  return jnp.where(ref_lengths > 0, lengths / jnp.where(ref_lengths > 0, ref_lengths, 1.0), jnp.inf)


def length_in_range(
  lengths: jax.Array, ref_lengths: jax.Array, tau_low: float = 0.5, tau_high: float = 2.0
) -> jax.Array:
  """bool: tau_low <= lengths / ref_lengths <= tau_high; False where the reference is empty.

  Compared as tau * ref <= len to keep the boundaries exact (rho == tau is inside).
  """
  lengths = jnp.asarray(lengths, jnp.float32)
  ref_lengths = jnp.asarray(ref_lengths, jnp.float32)
  return (ref_lengths > 0) & (tau_low * ref_lengths <= lengths) & (lengths <= tau_high * ref_lengths)


def apply_length_mask(
  rewards: jax.Array,
  lengths: jax.Array,
  ref_lengths: jax.Array,
  masked_dims: Sequence[int] | jax.Array,
  tau_low: float = 0.5,
  tau_high: float = 2.0,
) -> tuple[jax.Array, jax.Array]:
  """Zero the chosen reward dimensions of out-of-range captions.

  Args:
    rewards: float [B, G, R].
    lengths: [B, G] caption lengths (words or tokens, the same unit as ref_lengths).
    ref_lengths: [B] (one reference per prompt) or [B, G].
    masked_dims: reward dimension indices (static), or a bool [R] selector.
    tau_low, tau_high: inclusive bounds on rho = length / ref_length.
  Returns:
    (masked rewards float [B, G, R], in_range bool [B, G]). The reward stays valid: an out-of-range
    caption earned 0 on that dimension, unlike a failed judgment.
  """
  chex.assert_rank(rewards, 3)
  chex.assert_type(rewards, float)
  chex.assert_shape(lengths, rewards.shape[:2])
  if jnp.ndim(ref_lengths) == 1:
    chex.assert_shape(ref_lengths, rewards.shape[:1])
    ref_lengths = ref_lengths[:, None]
  else:
    chex.assert_shape(ref_lengths, rewards.shape[:2])
  num_rewards = rewards.shape[-1]
  if isinstance(masked_dims, (tuple, list, range)):
    selector = np.zeros(num_rewards, dtype=bool)
    selector[list(masked_dims)] = True  # IndexError on an out-of-range dimension, at trace time
    selector = jnp.asarray(selector)
  else:
    selector = jnp.asarray(masked_dims)
    chex.assert_shape(selector, (num_rewards,))
    chex.assert_type(selector, bool)
  in_range = length_in_range(lengths, ref_lengths, tau_low, tau_high)
  keep = in_range[..., None] | ~selector
  return jnp.where(keep, rewards, jnp.zeros_like(rewards)), in_range


def apply_length_mask_config(rewards, lengths, ref_lengths, config: LengthMaskConfig):
  """`apply_length_mask` with the bounds and dimensions from a `LengthMaskConfig`."""
  return apply_length_mask(rewards, lengths, ref_lengths, config.masked_dims, config.tau_low, config.tau_high)


def overlong_penalty(lengths, max_len: int, buffer: int, penalty: float = 1.0):
  """DAPO's soft overlong punishment (Yu et al. 2025, arXiv:2503.14476, eq. 13), reward units, float32:
  0 for lengths <= max_len - buffer, then falling linearly to -penalty at max_len (and beyond):
  min(-(length - (max_len - buffer)) / buffer * penalty, 0), as verl's DAPO reward manager (overlong_buffer), which
  also adds it to the score. `lengths` in tokens, the stop token included."""
  if not 0 < buffer <= max_len:
    raise ValueError(f"rl.overlong.buffer={buffer}: need 0 < buffer <= sampling.max_new_tokens={max_len}")
  exceed = np.asarray(lengths, np.float32) - np.float32(max_len - buffer)
  return np.minimum(-exceed / np.float32(buffer) * np.float32(penalty), np.float32(0.0))
