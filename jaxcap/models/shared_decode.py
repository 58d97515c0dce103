"""The decoder over G completions of each prompt with the prompt run once: the training passes' prompt-shared
forward (`jaxcap.train.steps.logprobs.completion_logprobs`).

A caption RL step scores G completions of one prompt, and the prompt is mostly image tokens. Repeating it per
completion runs the decoder over N x (P + C) positions; here the prompt stream [B, P] and the completion stream
[N, C] go through each layer side by side, the completions attending to their prompt's keys and values of that
layer (`group_attention`): B x P + N x C positions, the same values. Autodiff sums the G completions' gradients
into the prompt's keys and values, so the prompt's backward pass runs once too.

Shapes: B prompts, P prompt slots, N = B * G completions, C completion slots, D hidden.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxcap.models.layers import mrope_cos_sin, scan_layers
from jaxcap.sharding import shard

ACT_AXES = ("batch", None, None)
DEEPSTACK_AXES = (None, *ACT_AXES)


def decode_shared(
  model,
  prompts: jax.Array,
  prompt_positions: jax.Array,
  prompt_mask: jax.Array,
  completions: jax.Array,
  completion_positions: jax.Array,
  deepstack: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
  """Final-norm hidden states of the prompts [B, P, D] and completions [N, C, D] (rows b*G .. b*G+G-1 continue
  prompt b) from their embeddings, as `model.decode` computes them on the rows [prompt | completion] without a
  cache. prompt_positions int [3, B, P], prompt_mask bool [B, P] (real tokens), completion_positions int
  [3, B, C] (the same for a prompt's G completions); deepstack [n, B, P, D] (Qwen3-VL): added to the prompts'
  outputs of the first n layers (the completions are text: nothing to add)."""
  own = getattr(model, "decode_shared", None)
  if own is not None:  # a family whose decoder is not one stack of attention layers (Qwen3.5's hybrid)
    return own(prompts, prompt_positions, prompt_mask, completions, completion_positions, deepstack)
  cfg = model.cfg.text
  b, p, _ = prompts.shape
  g = completions.shape[0] // b
  rope = lambda pos: mrope_cos_sin(pos, cfg.head_dim, cfg.rope_theta, cfg.mrope_section, cfg.mrope_interleaved)
  prompt_rope = rope(prompt_positions)
  completion_rope = tuple(jnp.repeat(x, g, axis=0) for x in rope(completion_positions))  # [N, C, H]
  real = prompt_mask.astype(bool)
  causal = jnp.tril(jnp.ones((p, p), bool))[None, None] & real[:, None, None, :]

  def body(layer, streams, _):
    return layer.shared(*streams, prompt_rope, completion_rope, causal, real)

  unroll = not model.cfg.scan_layers
  narrow = jnp.dtype(model.cfg.param_dtype).itemsize < 4
  kw = dict(policy=model.cfg.remat, unroll=unroll, per_layer_converts=unroll and narrow)
  streams = (shard(prompts, ACT_AXES), shard(completions, ACT_AXES))
  n = 0 if deepstack is None else deepstack.shape[0]
  if n:  # the first n layers in a scan of their own, each adding its DeepStack slice to the prompts' output

    def add(layer, streams, extra):
      xp, xc = body(layer, streams, None)
      return shard(xp + shard(extra, ACT_AXES), ACT_AXES), xc

    streams = scan_layers(
      model.layers, add, streams, shard(deepstack.astype(prompts.dtype), DEEPSTACK_AXES), stop=n, **kw
    )
  xp, xc = scan_layers(model.layers, body, streams, start=n, **kw)
  return model.norm(xp), model.norm(xc)
