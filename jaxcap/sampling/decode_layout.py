"""Weights held the way the decode loop reads them, by a sampler that owns them (inference only: the annotator,
`Sampler.from_checkpoint`), in place of the model's own layout.

The decode program reads each decoder layer as its own arrays (`Qwen25VL.layer_params`): slices of the layer
stack, on CPU for few rows transposed into `row_blocks`. Built inside the program, those are a copy of every
decoder weight for each call's lifetime (the stack and its slices both live). `DecodeWeights` holds the layers
already sliced and laid out, and the stack as empty placeholders, so the programs read them as they are: one copy
of the weights. A trainer's sampler keeps its own params (the update needs the stack) and passes them per call;
its programs still lay them out per call, which on CPU costs the row-block copy for the call.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxcap.models import lora, row_blocks
from jaxcap.sharding import path_name


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecodeWeights:
  """params: the model's nnx param state with the decoder stack's leaves as empty placeholders and, in row
  blocks, an untied LM head [C, V / C, D]; layers: a tuple of L per-layer param states (kernels in row blocks
  where `blocked`)."""

  params: Any
  layers: tuple


def unpack(weights) -> tuple[Any, tuple | None]:
  """(params, layers) of a `DecodeWeights`, or (params, None) for a plain nnx param state."""
  if isinstance(weights, DecodeWeights):
    return weights.params, weights.layers
  return weights, None


def hold_for_decoding(state, cfg) -> DecodeWeights:
  """A model's nnx `state` (of config `cfg`) as `DecodeWeights`, built leaf by leaf: each stacked leaf is deleted
  once its layers' copies exist, so the peak is the weights plus one stacked leaf; a leaf still on disk (a
  `LayerReader`, `load_hf_checkpoint(layers_apart=True)`) is read a layer at a time, so the peak is the weights
  plus one layer. Row blocks where they apply to a decode of few rows (`row_blocks.applies(1)`: CPU, one device).
  `state`'s arrays are consumed."""
  if "layers" not in state:  # a hybrid decoder's two stacks (Qwen3.5: linear_layers, attention_layers)
    raise NotImplementedError(
      f"a sampler that owns its weights (owns_weights=True: the annotator, Sampler.from_checkpoint) holds a decoder "
      f"of one layer stack; {type(cfg).__name__}'s has several: pass owns_weights=False"
    )
  n = cfg.text.num_hidden_layers
  treedef_state = state["layers"]
  # LoRA's layers compute x W through qwix, which needs W as laid out when it made the adapters ([in, out])
  blocked_layers = row_blocks.applies(1) and not lora.has_adapters(treedef_state)
  stack = nnx.to_pure_dict(treedef_state)
  flat, treedef = jax.tree_util.tree_flatten_with_path(stack)
  per_leaf = []
  for path, leaf in flat:
    kernel = blocked_layers and re.search(r"kernel$", path_name(path)) is not None and leaf.ndim == 3
    if isinstance(leaf, jax.Array):
      per_leaf.append([(_layer_blocks if kernel else _layer)(leaf, i) for i in range(n)])
    else:  # a LayerReader: each layer read from disk straight into its layout
      per_leaf.append([leaf.blocks(i) if kernel else leaf.layer(i) for i in range(n)])
    leaf.delete()
  layers = tuple(
    _as_state(treedef_state, jax.tree_util.tree_unflatten(treedef, [leaves[i] for leaves in per_leaf]))
    for i in range(n)
  )
  params = nnx.to_pure_dict(state)
  params["layers"] = jax.tree.map(lambda a: jnp.zeros((0,), a.dtype), stack)
  head = None if cfg.text.tie_word_embeddings else params["lm_head"]["kernel"]
  if head is not None and not isinstance(head, jax.Array):  # a LayerReader
    params["lm_head"]["kernel"] = head.blocks(0) if row_blocks.applies(1) else head.layer(0)
  elif head is not None and row_blocks.applies(1):
    params["lm_head"]["kernel"] = jax.jit(row_blocks.from_kernel)(head)
    head.delete()
  held = jax.tree.map(lambda x: x, state)
  nnx.replace_by_pure_dict(held, params)
  return DecodeWeights(held, layers)


# one program per leaf shape, the layer a traced index (a static one compiled a program per layer: 432 at the 3B)
_layer = jax.jit(lambda stack, i: stack[i])
_layer_blocks = jax.jit(lambda stack, i: row_blocks.from_kernel(stack[i]))


def _as_state(template, pure: dict):
  """`pure` (a plain dict of arrays) as an nnx state shaped like `template`."""
  state = jax.tree.map(lambda x: x, template)
  nnx.replace_by_pure_dict(state, pure)
  return state
