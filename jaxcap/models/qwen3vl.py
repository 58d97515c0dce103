"""Qwen3-VL (dense) in Flax NNX: `Qwen3VLForConditionalGeneration` semantics, param names mirroring HF's.

The Qwen2.5-VL model with its variants switched by the config: the Qwen3 decoder (q/k RMSNorm, no q/k/v biases,
interleaved mRoPE: flags of `Qwen3TextConfig` read by the shared `jaxcap.models.decoder`), the Qwen3 vision tower
(`qwen3vl_vision`), and DeepStack: the tower's intermediate features, added to the outputs of the first decoder
layers at the visual tokens (`Qwen25VL.decode(..., deepstack=)`; prefill only, decode steps carry no vision).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxcap.models.qwen25vl import KVCache, Qwen25VL, VisionInput
from jaxcap.models.qwen3vl_config import Qwen3VLConfig
from jaxcap.models.qwen3vl_vision import Qwen3VisionTower


class Qwen3VL(Qwen25VL):
  """The Qwen3-VL student. `embed_vision` gives a prompt's embeddings and its DeepStack additions; `embed` takes
  text only (it has nowhere to put the DeepStack features, which a prompt's visual tokens need)."""

  @staticmethod
  def vision_tower(cfg: Qwen3VLConfig, rngs: nnx.Rngs) -> nnx.Module:
    return Qwen3VisionTower(
      cfg.vision, dtype=cfg.dtype, param_dtype=cfg.param_dtype, remat=cfg.remat, unroll=not cfg.scan_layers, rngs=rngs
    )

  def embed(self, input_ids: jax.Array, vision: VisionInput | None = None) -> jax.Array:
    """Token embeddings [B, T, D] of text tokens."""
    if vision is not None:
      raise ValueError("Qwen3-VL prompts with images need their DeepStack features: use embed_vision()")
    return self.embed_tokens(input_ids)

  def embed_vision(self, input_ids: jax.Array, vision: VisionInput | None) -> tuple[jax.Array, jax.Array | None]:
    """Token embeddings [B, T, D] with the merged visual features at image-pad then video-pad tokens, and the
    DeepStack additions [n, B, T, D] (the n intermediate features at those tokens, zero elsewhere) or None."""
    x = self.embed_tokens(input_ids)
    if vision is None:
      return x, None
    feats, deepstack = self.visual(vision.pixel_values, vision.layout)
    placed, is_visual = self.place_visual(input_ids, feats.astype(x.dtype))
    x = jnp.where(is_visual, placed, x)
    if deepstack is None:
      return x, None
    placed, _ = self.place_visual(input_ids, deepstack.astype(x.dtype))
    return x, jnp.where(is_visual, placed, 0).astype(x.dtype)

  def __call__(
    self,
    input_ids: jax.Array,
    positions: jax.Array,
    attention_mask: jax.Array,
    vision: VisionInput | None = None,
    cache: KVCache | None = None,
    cache_index: jax.Array | int = 0,
  ) -> tuple[jax.Array, KVCache | None]:
    """input_ids int [B, T] -> (float32 logits [B, T, V], updated cache); see `Qwen25VL.decode`."""
    x, deepstack = self.embed_vision(input_ids, vision)
    hidden, cache = self.decode(x, positions, attention_mask, cache, cache_index, deepstack=deepstack)
    return self.logits(hidden), cache
