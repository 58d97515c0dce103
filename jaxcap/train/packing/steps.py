"""The RL and SFT updates over packed micro-batches (`jaxcap.train.packing.rows`): `rl_step`'s and `sft_step`'s loss
and gradients, with each micro-batch's sequences packed into rows instead of padded.

Advantages, masks and rollout correction are computed over the whole step in the update's padded layout, exactly
as `rl_step` does; each packed micro-batch then gathers its sequences' slots. Its loss aggregates over its own
sequences and is weighted by its tokens (token-mean) or sequences (seq-mean-*), so the step's loss is the whole
batch's whatever the packing: token-mean over the global batch, seq-mean-* over its sequences, Dr.GRPO's constant
(`max_gen_len`, or C of the padded layout) unchanged.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxcap.rl import POLICY_LOSSES, PolicyLossConfig, policy_loss
from jaxcap.rl.rollout_correction import RolloutCorrectionConfig
from jaxcap.train.steps.accumulate import accumulate, apply_update
from jaxcap.train.steps.batches import PromptBatch, RolloutBatch
from jaxcap.train.packing.inputs import PackedInputs, flat_prompts, gather_sequences, packed_logprobs, token_source
from jaxcap.train.steps.state import TrainState
from jaxcap.train.steps.updates import micro_weights, rl_terms, surrogate_keys


def packed_rl_step(
  state: TrainState,
  prompts: PromptBatch,
  rollouts: RolloutBatch,
  packed: PackedInputs,
  *,
  graphdef,
  optimizer: optax.GradientTransformation,
  loss_config: PolicyLossConfig,
  estimator: str = "grpo",
  master_update: str = "exact",
  max_update_ratio: float = 0.0,
  correction: RolloutCorrectionConfig | None = None,
  mask_truncated: bool = False,
) -> tuple[TrainState, dict[str, jax.Array]]:
  """`rl_step` over packed rows: prompts [M0, b, P] and rollouts [M0, b*G, C] in the update's layout (their
  micro-batching is only a layout here; `prompts.pixel_values` is not read), `packed` the step's vision pack and
  packed micro-batches [M, ...]."""
  pixels, rows = packed.pixels, packed.rows
  advantages, sample_valid, old, ref, cmask, extras, adv_metrics, extra_metrics = rl_terms(
    rollouts, loss_config, estimator, correction, mask_truncated
  )
  gather = lambda x: None if x is None else gather_sequences(x, rows)
  valid = gather(sample_valid) & rows.seq_valid
  cmask = gather(cmask) & rows.seq_valid[..., None]
  extras = {k: gather(v) for k, v in extras.items()}
  if POLICY_LOSSES[loss_config.policy].uses_key:
    extras["key"] = surrogate_keys(state, rows.source.shape[0])
  tokens = rollouts.tokens
  source = token_source(*flat_prompts(prompts), tokens.reshape(-1, tokens.shape[-1]))

  def loss_fn(params, mb):
    mb_rows, mask, old_lp, ref_lp, adv, ok, extra = mb
    model = nnx.merge(graphdef, params)
    lp, ent = packed_logprobs(model, source, mb_rows, pixels, tokens.shape[-1], with_entropy=True)
    return policy_loss(lp, old_lp, adv, mask, loss_config, ref_logprobs=ref_lp, sample_valid=ok, entropy=ent, **extra)

  batches = (rows, cmask, gather(old), gather(ref), gather(advantages), valid, extras)
  weights = micro_weights(cmask, valid, loss_config.loss_aggregation)
  loss, metrics, grads = accumulate(loss_fn, state.params, batches, weights, trains_base=state.trains_base)
  state, opt_metrics = apply_update(state, grads, optimizer, master_update, loss, max_update_ratio)
  adv_metrics = {f"adv/{k}": v for k, v in adv_metrics.items()}
  return state, {"loss": loss, **metrics, **opt_metrics, **adv_metrics, **extra_metrics}


def packed_sft_step(
  state: TrainState,
  prompts: PromptBatch,
  targets: jax.Array,
  target_mask: jax.Array,
  packed: PackedInputs,
  *,
  graphdef,
  optimizer: optax.GradientTransformation,
  master_update: str = "exact",
  max_update_ratio: float = 0.0,
) -> tuple[TrainState, dict[str, jax.Array]]:
  """`sft_step` over packed rows: prompts [M0, b, P] and targets / target_mask [M0, b, C] in the update's layout
  (`prompts.pixel_values` is not read), `packed` the step's vision pack and packed micro-batches [M, ...] of its
  (prompt, target) sequences. Each micro-batch's token-mean NLL weighted by its target tokens: the whole batch's
  token-mean, as the padded step."""
  pixels, rows = packed.pixels, packed.rows
  c = targets.shape[-1]
  source = token_source(*flat_prompts(prompts), targets.reshape(-1, c))
  mask = gather_sequences(target_mask, rows) & rows.seq_valid[..., None]  # [M, S, C]

  def loss_fn(params, mb):
    mb_rows, mb_mask = mb
    lp, _ = packed_logprobs(nnx.merge(graphdef, params), source, mb_rows, pixels, c)
    mb_mask = mb_mask.astype(jnp.float32)
    nll = -jnp.sum(lp * mb_mask) / jnp.maximum(jnp.sum(mb_mask), 1.0)
    return nll, {"nll": nll}

  weights = jnp.sum(mask, axis=(1, 2))
  loss, metrics, grads = accumulate(loss_fn, state.params, (rows, mask), weights, trains_base=state.trains_base)
  state, opt_metrics = apply_update(state, grads, optimizer, master_update, loss, max_update_ratio)
  return state, {"loss": loss, **metrics, **opt_metrics}
