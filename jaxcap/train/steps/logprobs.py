"""Teacher-forced log-probs of completions given their prompts: the quantity every loss in jaxcap needs.

Shapes: B prompts, G completions per prompt, N = B * G sequences, P prompt length, C completion length,
D hidden, V vocab.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxcap.models.qwen25vl import Qwen25VL, VisionInput
from jaxcap.models.shared_decode import decode_shared


def completion_positions(prompt_positions: jax.Array, prompt_mask: jax.Array, length: int) -> jax.Array:
  """mRoPE ids of the completion tokens: all three ids continue from the prompt's largest id.

  prompt_positions int [3, B, P], prompt_mask [B, P] -> int [3, B, length].
  """
  start = jnp.max(jnp.where(prompt_mask[None], prompt_positions, -1), axis=(0, 2)) + 1  # [B]
  pos = start[:, None] + jnp.arange(length)[None, :]
  return jnp.broadcast_to(pos[None], (3, *pos.shape)).astype(prompt_positions.dtype)


def _token_stats(model: Qwen25VL, hidden: jax.Array, tokens: jax.Array, with_entropy: bool):
  # logit - logsumexp (as the sampler computes a sampled token's log-prob): without entropy no [.., V] log-prob array
  # is written, and the backward pass writes one softmax instead of log_softmax's two [.., V] passes
  logits = model.logits(hidden)
  lse = jax.nn.logsumexp(logits, axis=-1)
  token_logp = jnp.take_along_axis(logits, tokens[..., None], axis=-1)[..., 0] - lse
  if not with_entropy:
    return token_logp, jnp.zeros_like(token_logp)
  logp = logits - lse[..., None]
  return token_logp, -jnp.sum(jnp.exp(logp) * logp, axis=-1)


def token_logprobs(
  model: Qwen25VL, hidden: jax.Array, tokens: jax.Array, *, with_entropy: bool = False, chunk: int | None = 256
) -> tuple[jax.Array, jax.Array]:
  """log pi(token) and entropy [N, C] from final hidden states [N, C, D] that predict `tokens` [N, C].

  Sequences longer than `chunk` are processed `chunk` positions at a time, each chunk rematerialised in the
  backward pass, so the float32 [N, C, V] logits never exist at once (at 1024 tokens and a 152k vocabulary they
  would be gigabytes per sequence).
  """
  n, c, d = hidden.shape
  if chunk is None or c <= chunk:
    return _token_stats(model, hidden, tokens, with_entropy)
  pad = -c % chunk
  h = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0))).reshape(n, -1, chunk, d).swapaxes(0, 1)
  t = jnp.pad(tokens, ((0, 0), (0, pad))).reshape(n, -1, chunk).swapaxes(0, 1)
  graphdef, state = nnx.split(model)

  @jax.checkpoint
  def one(args):
    hh, tt = args
    return _token_stats(nnx.merge(graphdef, state), hh, tt, with_entropy)

  lp, ent = jax.lax.map(one, (h, t))
  unchunk = lambda x: x.swapaxes(0, 1).reshape(n, -1)[:, :c]
  return unchunk(lp), unchunk(ent)


def completion_logprobs(
  model: Qwen25VL,
  prompt_ids: jax.Array,
  prompt_positions: jax.Array,
  prompt_mask: jax.Array,
  vision: VisionInput | None,
  completions: jax.Array,
  *,
  with_entropy: bool = False,
  chunk: int | None = None,
  share_prompt: bool | None = None,
) -> tuple[jax.Array, jax.Array | None]:
  """log pi(completion token | prompt, earlier tokens) for G completions of each of B prompts.

  prompt_ids int [B, P] (left-padded), prompt_positions int [3, B, P], prompt_mask bool [B, P],
  completions int [N, C] with N a multiple of B (rows b*G .. b*G+G-1 belong to prompt b).
  The prompt (and its images) is embedded once and shared by its G completions; with `share_prompt` (default:
  the model config's) it also goes through the decoder once for them (`decode_shared`: B x P + N x C positions
  instead of N x (P + C), the same values to float rounding).
  Returns float32 log-probs [N, C] and, if asked, per-token entropies [N, C] (nats). The LM head runs `chunk`
  positions at a time (default: the model config's `logprob_chunk`).
  """
  b, p = prompt_ids.shape
  n, c = completions.shape
  g = n // b
  x_prompt, deepstack = model.embed_vision(prompt_ids, vision)
  completion_pos = completion_positions(prompt_positions, prompt_mask, c)  # [3, B, C]
  share = model.cfg.share_prompt if share_prompt is None else share_prompt
  if share and g > 1:  # each prompt through the decoder once for its G completions (`decode_shared`)
    h_prompt, h_completion = decode_shared(
      model, x_prompt, prompt_positions, prompt_mask, model.embed_tokens(completions), completion_pos, deepstack
    )
    # position t predicts token t + 1: the prompt's last slot predicts each completion's first token
    hidden = jnp.concatenate([jnp.repeat(h_prompt[:, p - 1 :], g, axis=0), h_completion[:, : c - 1]], axis=1)
  else:
    x = jnp.concatenate([jnp.repeat(x_prompt, g, axis=0), model.embed_tokens(completions)], axis=1)
    if deepstack is not None:  # [n, B, P, D] -> [n, N, P + C, D]: the completions are text, nothing to add there
      deepstack = jnp.pad(jnp.repeat(deepstack, g, axis=1), ((0, 0), (0, 0), (0, c), (0, 0)))
    positions = jnp.repeat(jnp.concatenate([prompt_positions, completion_pos], axis=2), g, axis=1)
    mask = jnp.concatenate([jnp.repeat(prompt_mask, g, axis=0), jnp.ones((n, c), bool)], axis=1)
    hidden, _ = model.decode(x, positions, mask, deepstack=deepstack)
    hidden = hidden[:, p - 1 : p + c - 1]  # position t predicts token t + 1
  token_logp, entropy = token_logprobs(
    model, hidden, completions, with_entropy=with_entropy, chunk=chunk or model.cfg.logprob_chunk
  )
  return token_logp, entropy if with_entropy else None
