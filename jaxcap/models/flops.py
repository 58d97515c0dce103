"""Model FLOPs of a student's update (Qwen2.5-VL, Qwen3-VL, Qwen3.5; the PaLM / MFU convention) and accelerators' peak rates.

XLA's `cost_analysis()` counts a loop body once, so with scanned layer stacks it under-reports a step by about the
depth; MFU and `jaxcap.plan` use these analytic counts instead:
  decoder   6 x (decoder params) x (N sequences x (P prompt + C completion) tokens)
          + 12 x layers x (heads x head_dim) x T per token for attention (T = P + C, counted as full attention; a
            hybrid decoder's full-attention layers only, its linear layers 3 x `linear_mixing_flops` per token)
            (a prompt-shared pass, `padded_pass_counts`: B x P + N x C tokens, each prompt token reading P keys and
            each completion token P + C)
          + 6 x hidden x vocab x (N x C) for the LM head, applied only at completion positions
  vision    6 x (patch-embed + ViT-block params) x patches + 6 x (merger params, DeepStack's too) x patches / merge^2
          + 12 x hidden x window x patches per block (window = 64 patches for Qwen2.5-VL's window blocks, the whole
            image for full-attention blocks: `attention_context`); each image is encoded once per update, not once
            per completion. Lookup tables (token and learned position embeddings) cost no FLOPs.
A forward pass alone is a third of these.
"""

from __future__ import annotations

import numpy as np

# bf16 dense peak TFLOP/s per chip, matched against `device.device_kind` (lower-cased) in order.
PEAK_TFLOPS = (
  ("h200", 989.0),
  ("h100", 989.0),
  ("a100", 312.0),
  ("v5 lite", 197.0),
  ("v5e", 197.0),
  ("v5litepod", 197.0),
  ("v5p", 459.0),
  ("tpu v5", 459.0),
  ("v4", 275.0),
)


def peak_tflops(device_kind: str) -> float | None:
  kind = device_kind.lower()
  for key, value in PEAK_TFLOPS:
    if key in kind:
      return value
  return None


def param_counts(params) -> dict[str, int]:
  """Parameter counts by part of the model: vision blocks + patch embed, merger, decoder layers, embedding."""
  import jax

  counts = {"vision": 0, "merger": 0, "decoder": 0, "embedding": 0, "lm_head": 0}
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    names = [str(getattr(p, "key", getattr(p, "name", getattr(p, "idx", p)))) for p in path]
    n = int(np.prod(leaf.shape))
    if names[0] == "visual" and "pos_embed" in names:  # Qwen3-VL's learned position table: a lookup
      counts["embedding"] += n
    elif names[0] == "visual":
      counts["merger" if any("merger" in name for name in names) else "vision"] += n
    elif names[0] == "embed_tokens":
      counts["embedding"] += n
    elif names[0] == "lm_head":
      counts["lm_head"] += n
    else:  # layers.*, the final norm
      counts["decoder"] += n
  counts["total"] = sum(counts.values())
  return counts


def full_attention_layers(text_cfg) -> int:
  """The decoder layers with softmax attention over the sequence (all but a hybrid decoder's linear layers)."""
  types = getattr(text_cfg, "layer_types", None)
  return types.count("full_attention") if types else text_cfg.num_hidden_layers


def linear_mixing_flops(text_cfg, chunk: int = 64) -> float:
  """Forward FLOPs per token of a hybrid decoder's linear-attention token mixing, all its linear layers (0 for a
  plain decoder): per value head, the chunked gated delta rule's state read and write (2 Dk Dv each) and its
  intra-chunk attention (C (Dk + Dv))."""
  types = getattr(text_cfg, "layer_types", None)
  if not types:
    return 0.0
  t = text_cfg
  dk, dv, hv = t.linear_key_head_dim, t.linear_value_head_dim, t.linear_num_value_heads
  return 2.0 * types.count("linear_attention") * hv * (2 * dk * dv + chunk * (dk + dv))


def padded_pass_counts(sequences: int, prompt: int, completion: int, prompts: int | None = None) -> dict[str, int]:
  """A padded pass's decoder work over `sequences` rows of `prompt` + `completion` slots: token slots through the
  layers, LM-head positions and attention (query, key) pairs (dense, masked ones included). Each row repeating its
  prompt, or, with `prompts` (the distinct prompts, sequences / prompts completions each), each prompt once and its
  completions reading its keys (`jaxcap.models.shared_decode`)."""
  if prompts is None:
    width = prompt + completion
    return dict(slots=sequences * width, head_positions=sequences * completion, attention_pairs=sequences * width**2)
  return dict(
    slots=prompts * prompt + sequences * completion,
    head_positions=sequences * completion,
    attention_pairs=prompts * prompt**2 + sequences * completion * (prompt + completion),
  )


def decoder_pass_flops(text_cfg, *, slots: int, head_positions: int, attention_pairs: int) -> float:
  """Forward FLOPs of a decoder pass (text config `text_cfg`) over `slots` token slots, the LM head at
  `head_positions`, and attention over `attention_pairs` (query, key) pairs computed, masked ones included: what
  decides a step's layout (`jaxcap.train.packing.rows.packing_pays`); a backward scales every term alike."""
  t = text_cfg
  q, kv = t.num_attention_heads * t.head_dim, t.num_key_value_heads * t.head_dim
  layer = t.hidden_size * (2 * q + 2 * kv) + 3 * t.hidden_size * t.intermediate_size
  return (
    2.0 * layer * t.num_hidden_layers * slots
    + 2.0 * t.hidden_size * t.vocab_size * head_positions
    + 4.0 * full_attention_layers(t) * q * attention_pairs
    + linear_mixing_flops(t) * slots
  )


def model_flops(
  cfg,
  counts: dict,
  *,
  sequences: int,
  prompt: int,
  completion: int,
  images: int,
  patches_per_image: int,
  prompts: int | None = None,
) -> dict[str, float]:
  """Model FLOPs of one update (forward + backward), see the module docstring; with `prompts` (the distinct
  prompts of a prompt-shared pass, `padded_pass_counts`) the decoder's work of that pass."""
  t, v = cfg.text, cfg.vision
  work = padded_pass_counts(sequences, prompt, completion, prompts)
  decoder = 6 * counts["decoder"] * work["slots"]
  attention = 12 * full_attention_layers(t) * t.num_attention_heads * t.head_dim * work["attention_pairs"]
  attention += 3 * linear_mixing_flops(t) * work["slots"]
  lm_head = 6 * t.hidden_size * t.vocab_size * work["head_positions"]
  patches = images * patches_per_image
  ctx = attention_context(v, patches_per_image)
  vision = (
    6 * counts["vision"] * patches
    + 6 * counts["merger"] * patches / v.spatial_merge_size**2
    + 12 * v.hidden_size * ctx * patches
  )
  return {"decoder": decoder + attention + lm_head, "vision": vision, "total": decoder + attention + lm_head + vision}


def attention_context(v, patches_per_image: int) -> int:
  """Keys each patch attends to, summed over the ViT's blocks: Qwen2.5-VL's window blocks see their window (64
  patches at most), its full-attention blocks and every Qwen3-VL block (no `window_size`) the whole image."""
  if not hasattr(v, "window_size"):
    return v.depth * patches_per_image
  window = (v.window_size // v.patch_size) ** 2
  full = len([i for i in v.fullatt_block_indexes if i < v.depth])
  return (v.depth - full) * min(window, patches_per_image) + full * patches_per_image
