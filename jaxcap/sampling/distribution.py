"""Next-token sampling from logits: temperature, top-k, top-p (nucleus), greedy.

Pure functions on [B, V] float32 logits. The filters follow `transformers`' warper order and semantics
(temperature, then top-k, then top-p keeping the smallest prefix of the descending order whose mass reaches p).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """How tokens are drawn; hashable, so it is a static argument of the compiled sampler.

  temperature: 0 means greedy (argmax); otherwise logits are divided by it.
  top_k: keep the k most likely tokens (0 = all). top_p: keep the smallest most-likely set of mass >= p (1 = all).
  max_new_tokens: length of the returned completion arrays. stop_ids: tokens that end a sequence (the stop
  token is emitted and counted in its length); `None` means the model's EOS; `()` never stops early.
  """

  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  max_new_tokens: int = 48
  stop_ids: tuple[int, ...] | None = None

  def __post_init__(self):
    if self.temperature < 0:
      raise ValueError(f"temperature={self.temperature}; use 0 for greedy or a positive value")
    if not 0 < self.top_p <= 1:
      raise ValueError(f"top_p={self.top_p}; it must lie in (0, 1] (1 disables nucleus filtering)")
    if self.top_k < 0:
      raise ValueError(f"top_k={self.top_k}; use 0 to disable top-k filtering or a positive count")
    if self.max_new_tokens < 1:
      raise ValueError(f"max_new_tokens={self.max_new_tokens}; generate at least one token")
    if self.stop_ids is not None:
      object.__setattr__(self, "stop_ids", tuple(int(i) for i in self.stop_ids))

  @property
  def greedy(self) -> bool:
    return self.temperature == 0

  def resolve_stop_ids(self, eos_token_id: int) -> tuple[int, ...]:
    return (eos_token_id,) if self.stop_ids is None else self.stop_ids


def filtered_logits(logits: jax.Array, cfg: SamplingConfig) -> tuple[jax.Array, jax.Array | None]:
  """The sampling distribution as (candidate logits [B, C], candidate token ids [B, C] or None for C = V).

  Removed candidates hold -inf. With top-k only the k best are kept as candidates, so no full-vocabulary sort
  is paid; a full sort happens only for top-p without top-k.
  """
  z = logits.astype(jnp.float32)
  z = z if cfg.temperature == 1 else z / cfg.temperature  # x / 1 == x: no pass over the vocabulary
  vocab = z.shape[-1]
  ids = None
  if 0 < cfg.top_k < vocab or cfg.top_p < 1:
    k = cfg.top_k if 0 < cfg.top_k < vocab else vocab
    z, ids = jax.lax.top_k(z, k)  # descending
    ids = ids.astype(jnp.int32)
  if cfg.top_p < 1:
    probs = jax.nn.softmax(z, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    z = jnp.where(mass_before < cfg.top_p, z, -jnp.inf)  # the most likely token always survives
  return z, ids


def sample_tokens(
  key: jax.Array | None, logits: jax.Array, cfg: SamplingConfig, uniform: jax.Array | None = None
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Draws one token per row of logits float32 [B, V], from `key` or, given, the rows' own uniforms [B] in [0, 1).

  Returns (tokens int32 [B], sample_logprobs float32 [B], policy_logprobs float32 [B]):
  sample_logprobs are log-probabilities under the distribution actually sampled from (tempered and filtered;
  0 for greedy, a point mass); policy_logprobs are the model's plain log-softmax (temperature 1, no filters),
  the quantity a PPO / GRPO ratio needs.
  """
  logits = logits.astype(jnp.float32)
  if cfg.greedy:
    tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    sample_lp = jnp.zeros(tokens.shape, jnp.float32)
  else:
    z, ids = filtered_logits(logits, cfg)
    choice, sample_lp = categorical_with_logprob(key, z, uniform=uniform)
    tokens = (choice if ids is None else _take(ids, choice)).astype(jnp.int32)
    if cfg.temperature == 1 and cfg.top_p == 1 and ids is None:  # unfiltered, untempered: the policy itself
      return tokens, sample_lp, sample_lp
  policy_lp = _take(logits, tokens) - jax.nn.logsumexp(logits, axis=-1)
  return tokens, sample_lp, policy_lp


def categorical(key: jax.Array, logits: jax.Array, block: int = 128) -> jax.Array:
  """One draw per row from softmax(logits) float32 [B, C] (-inf = excluded) -> int32 [B]; see
  `categorical_with_logprob`."""
  return categorical_with_logprob(key, logits, block)[0]


def categorical_with_logprob(
  key: jax.Array | None, logits: jax.Array, block: int = 128, uniform: jax.Array | None = None
) -> tuple[jax.Array, jax.Array]:
  """One draw per row from softmax(logits) float32 [B, C] (-inf = excluded), by two-level inverse CDF of one
  uniform per row: drawn from `key`, or the rows' own `uniform` [B] in [0, 1) (the paged engine's per-sample
  streams).

  Returns (choice int32 [B], its log-probability float32 [B]). The log-probability is logits[choice] - logsumexp,
  with the log-sum-exp taken from the draw's own normaliser (the sum of exp(logits - max)), so the vocabulary is
  exponentiated once per step, not twice.

  Why not `jax.random.categorical`: its Gumbel trick needs C random numbers per row (~25 ms per step for
  32 x 32k on a 2-core CPU); this needs one uniform per row and a cumulative sum over C / block block totals
  plus one block (~0.5 ms).
  """
  b, c = logits.shape
  top = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
  p = jnp.exp(logits - top)
  p = jnp.pad(p, ((0, 0), (0, -c % block))).reshape(b, -1, block)
  block_mass = p.sum(-1)  # [B, C / block]
  block_cdf = jnp.cumsum(block_mass, axis=-1)
  total = block_cdf[:, -1:]
  u = jax.random.uniform(key, (b, 1)) if uniform is None else uniform.reshape(b, 1)
  target = (1.0 - u) * total  # u in (0, 1]: never picks mass 0
  j = jnp.minimum(jnp.sum(block_cdf < target, axis=-1), block_cdf.shape[1] - 1)  # first block reaching it
  inner = jnp.take_along_axis(p, j[:, None, None], axis=1)[:, 0]  # [B, block]
  cdf = jnp.cumsum(inner, axis=-1) + _take(block_cdf - block_mass, j)[:, None]
  last_real = block - 1 - jnp.argmax(inner[:, ::-1] > 0, axis=-1)  # rounding must not land on a mass-0 slot
  i = jnp.minimum(jnp.sum(cdf < target, axis=-1), last_real)
  choice = (j * block + i).astype(jnp.int32)
  return choice, _take(logits, choice) - (top + jnp.log(total))[:, 0]


def is_stop(tokens: jax.Array, stop_ids: Sequence[int]) -> jax.Array:
  """bool, same shape as tokens: which tokens end their sequence."""
  out = jnp.zeros(tokens.shape, bool)
  for s in stop_ids:
    out = out | (tokens == s)
  return out


def _take(x: jax.Array, index: jax.Array) -> jax.Array:
  return jnp.take_along_axis(x, index[..., None].astype(jnp.int32), axis=-1)[..., 0]
