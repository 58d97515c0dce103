"""A prompt's token embeddings with its images' and videos' features in place: the vision input a batch carries
(`VisionInput`) and the `VisualTokens` methods every student family shares (`Qwen25VL` and its subclasses).

Shapes: B batch, T tokens, D hidden; F merged visual features (images then videos, in prompt order).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxcap.models.vision import VisionLayout
from jaxcap.sharding import shard

ACT_AXES = ("batch", None, None)  # hidden states [B, T, D]
DEEPSTACK_AXES = (None, *ACT_AXES)  # DeepStack additions [n, B, T, D], laid out like the states they join


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class VisionInput:
  """Patches of all images then all videos of a batch, in prompt order, with their host-computed layout.

  pixel_values: float [L, patch_dim]; layout: `vision_layout(grid_thw)` of the same items.
  """

  pixel_values: jax.Array
  layout: VisionLayout


class VisualTokens:
  """Embedding with vision, for a module with `embed_tokens`, `visual` (the family's tower, whose `features` gives
  (merged features, DeepStack features or None)) and `cfg` (image / video token ids)."""

  def visual_features(self, pixel_values: jax.Array, layout) -> tuple[jax.Array, jax.Array | None]:
    """Patches -> merged visual features [F, D] and the DeepStack features [n, F, D] the family adds to its first
    n decoder layers (Qwen3-VL), or None (Qwen2.5-VL has none)."""
    return self.visual.features(pixel_values, layout)

  def embed_vision(self, input_ids: jax.Array, vision: VisionInput | None) -> tuple[jax.Array, jax.Array | None]:
    """Token embeddings [B, T, D] with the visual features placed, in order, at image-pad then video-pad tokens,
    and the DeepStack additions [n, B, T, D] for `decode(..., deepstack=)` (zero away from the visual tokens), or
    None. Every caller that embeds a prompt with its images goes through here, for either family."""
    x = self.embed_tokens(input_ids)
    if vision is None:
      return x, None
    feats, deepstack = self.visual_features(vision.pixel_values, vision.layout)  # [Ni + Nv, D]
    placed, is_visual = self.place_visual(input_ids, feats.astype(x.dtype))
    x = jnp.where(is_visual, placed, x)
    if deepstack is None:
      return x, None
    placed, _ = self.place_visual(input_ids, deepstack.astype(x.dtype))
    # laid out like the hidden states it is added to (batch-sharded): left to itself XLA shards it after the
    # gather's features and reshards it in full at every layer that adds it
    return x, shard(jnp.where(is_visual, placed, 0).astype(x.dtype), DEEPSTACK_AXES)

  def embed(self, input_ids: jax.Array, vision: VisionInput | None = None) -> jax.Array:
    """Token embeddings [B, T, D] with visual features placed (`embed_vision` without DeepStack additions: a
    family that has them refuses, since dropping them would change the model)."""
    x, deepstack = self.embed_vision(input_ids, vision)
    if deepstack is not None:
      raise ValueError(f"{type(self).__name__} prompts with images need their DeepStack features: use embed_vision()")
    return x

  def place_visual(self, input_ids: jax.Array, feats: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Visual features feats [..., Ni + Nv, D] (images then videos) gathered to the prompt's image-pad then
    video-pad tokens, in order: [..., B, T, D] (a real token's slot holds an arbitrary feature), and the mask bool
    [B, T, 1] of those tokens."""
    is_img = (input_ids == self.cfg.image_token_id).reshape(-1)
    is_vid = (input_ids == self.cfg.video_token_id).reshape(-1)
    img_idx = jnp.cumsum(is_img) - 1
    vid_idx = jnp.sum(is_img) + jnp.cumsum(is_vid) - 1
    idx = jnp.clip(jnp.where(is_img, img_idx, jnp.where(is_vid, vid_idx, 0)), 0, feats.shape[-2] - 1)
    placed = jnp.take(feats, idx, axis=-2).reshape(*feats.shape[:-2], *input_ids.shape, feats.shape[-1])
    return placed, (is_img | is_vid).reshape(*input_ids.shape, 1)
