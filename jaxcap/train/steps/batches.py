"""The batches an update step takes: prompts and their rollouts, each with a leading micro-batch axis M; and the
host batch an update's `prepare` builds ahead of its step (records + their prompts, numpy only)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from jaxcap.data.records import ImageRecord


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PromptBatch:
  """M micro-batches of b prompts. ids int [M, b, P]; positions int [M, 3, b, P]; mask bool [M, b, P];
  pixel_values float [M, L, patch_dim] or None (each micro-batch's images packed and padded to L patches; their
  layouts are passed separately)."""

  ids: jax.Array
  positions: jax.Array
  mask: jax.Array
  pixel_values: jax.Array | None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RolloutBatch:
  """G completions per prompt, in prompt order. tokens int [M, b*G, C]; mask bool [M, b*G, C];
  old_logprobs float [M, b*G, C] (the sampling policy's); rewards float [M, b, G, R]; reward_valid bool
  [M, b, G, R]; weights float [R] (reward weights); ref_logprobs float [M, b*G, C] under the frozen
  reference, or None without a KL term; behaviour_logprobs float [M, b*G, C], the sampler's own log-probs (the
  behaviour policy), only with rollout correction; truncated bool [M, b*G] (hit max_new_tokens without a stop
  token), only with mask_truncated."""

  tokens: jax.Array
  mask: jax.Array
  old_logprobs: jax.Array
  rewards: jax.Array
  reward_valid: jax.Array
  weights: jax.Array
  ref_logprobs: jax.Array | None = None
  behaviour_logprobs: jax.Array | None = None
  truncated: jax.Array | None = None


@dataclasses.dataclass
class HostBatch:
  """One step's records and their prompts prepared on the host: SFT (PromptBatch of numpy arrays, grid), RL a
  bucketed `SamplerBatch`."""

  records: list[ImageRecord]
  prompts: Any
  questions: list | None = None  # SFT with VQA examples: per record, the question it is asked, or None (caption)
