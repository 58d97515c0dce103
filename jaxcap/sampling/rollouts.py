"""What a rollout produced: `SampledArrays` (the decode loop's global device arrays) and `Rollouts` (this
process's rows of them, copied to the host only when asked)."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SampledArrays:
  """What the decode loop produced, as global device arrays in the sampler's row order: every process's block of
  `block * G` rows (its prompts padded to their bucket, G samples each), blocks in the order of the global batch.
  tokens int32 [P * block * G, N]; sample_logprobs / policy_logprobs float32 [P * block * G, N]; lengths int32
  [P * block * G]. Nothing here has been copied to the host."""

  tokens: jax.Array
  sample_logprobs: jax.Array
  policy_logprobs: jax.Array
  lengths: jax.Array


class Rollouts:
  """G completions for each of B prompts; row b * G + g is sample g of prompt b. R = B * G, N = max_new_tokens.

  tokens int32 [R, N]: completion ids, pad id after the stop token.
  sample_logprobs float32 [R, N]: log-probs under the distribution sampled from (tempered, top-k/top-p
    filtered; 0 for greedy). policy_logprobs float32 [R, N]: the model's own temperature-1 log-probs of the
    same tokens, the "old policy" term of a PPO / GRPO ratio. Both are 0 where completion_mask is False.
  completion_mask bool [R, N]: emitted tokens, the stop token included. lengths int32 [R]: its row sums.
  prompt_index int32 [R]: which prompt each row samples. text: decoded completions (special tokens skipped),
    or None when the sampler has no tokenizer.

  These are this process's rows: device arrays with one process; with several, host arrays copied from this
  process's own shards (no collective). Each is computed on first use, so a caller that keeps to `arrays` (the
  global device arrays, e.g. the trainer's update) and `text` copies only its rows' tokens and lengths to the
  host, once, after the rollout finished; `host_lengths` are those lengths.
  """

  def __init__(self, arrays: SampledArrays, *, rows: int, num_samples: int, first_row: int, tokenizer, multi: bool):
    self.arrays = arrays
    self.rows, self.num_samples, self.tokenizer, self.multi = rows, num_samples, tokenizer, multi
    lo = first_row * num_samples
    self._local = slice(lo, lo + rows * num_samples)

  def _rows(self, x: jax.Array):
    return fetch_rows(x, self._local.start, self._local.stop) if self.multi else x[: self._local.stop]

  @functools.cached_property
  def _host(self) -> tuple[np.ndarray, np.ndarray]:
    a, lo, hi = self.arrays, self._local.start, self._local.stop
    if self.multi:
      return fetch_rows(a.tokens, lo, hi), fetch_rows(a.lengths, lo, hi)
    return np.asarray(a.tokens)[lo:hi], np.asarray(a.lengths)[lo:hi]

  @functools.cached_property
  def tokens(self):
    return self._host[0] if self.multi else self._rows(self.arrays.tokens)

  @functools.cached_property
  def lengths(self):
    return self._host[1] if self.multi else self._rows(self.arrays.lengths)

  @functools.cached_property
  def sample_logprobs(self):
    return self._rows(self.arrays.sample_logprobs)

  @functools.cached_property
  def policy_logprobs(self):
    return self._rows(self.arrays.policy_logprobs)

  @functools.cached_property
  def completion_mask(self):
    n = self.arrays.tokens.shape[1]
    if self.multi:
      return np.arange(n)[None, :] < self.lengths[:, None]
    return jnp.arange(n)[None, :] < self.lengths[:, None]

  @functools.cached_property
  def prompt_index(self):
    return jnp.repeat(jnp.arange(self.rows, dtype=jnp.int32), self.num_samples)

  @property
  def host_lengths(self) -> np.ndarray:
    """This process's rows' lengths as a host array (the copy `text` decodes from)."""
    return self._host[1]

  @functools.cached_property
  def text(self) -> list[str] | None:
    if self.tokenizer is None:
      return None
    tokens, lengths = self._host
    return self.tokenizer.batch_decode([t[:n] for t, n in zip(tokens, lengths)], skip_special_tokens=True)


def fetch_rows(x: jax.Array, lo: int, hi: int) -> np.ndarray:
  """Rows [lo, hi) of the global array `x` as a host array, copied from this process's addressable shards only
  (each needed element once); no collective, so nothing of other processes' rows moves."""
  out = np.empty((hi - lo, *x.shape[1:]), x.dtype)
  covered = np.zeros(out.shape, bool)
  for shard in x.addressable_shards:
    index = shard.index if shard.index else (slice(None),)
    start, stop, _ = index[0].indices(x.shape[0])
    a, b = max(start, lo), min(stop, hi)
    if a >= b:
      continue
    dst = (slice(a - lo, b - lo), *index[1:])
    if covered[dst].all():
      continue  # a replica of what was copied
    out[dst] = np.asarray(shard.data)[a - start : b - start]
    covered[dst] = True
  if not covered.all():
    raise ValueError(f"rows [{lo}, {hi}) of an array of shape {x.shape} are not all on this process's devices")
  return out
