"""Qwen3.5 presets: the dense checkpoints' shapes, tiny / mid configs for tests and benchmarks, and the embedded
student's Qwen3.5 twin of a Qwen2.5-VL config (`qwen35_like`)."""

from __future__ import annotations

import dataclasses

from jaxcap.models.config import Qwen25VLConfig
from jaxcap.models.qwen35_config import Qwen35Config, Qwen35TextConfig, interval_layer_types
from jaxcap.models.qwen3vl_config import Qwen3VisionConfig


def _sections(rotary_dim: int) -> tuple[int, int, int]:
  """mRoPE bands of `rotary_dim` in Qwen3.5's proportions (11 : 11 : 10 of 32)."""
  half = rotary_dim // 2
  h = max(1, half * 11 // 32)
  w = max(1, half * 10 // 32)
  return (half - h - w, h, w)


def qwen35_like(cfg: Qwen25VLConfig, position_grid: int = 4) -> Qwen35Config:
  """The Qwen3.5 config of the same widths, depths and token ids as the Qwen2.5-VL config `cfg` (the embedded
  student's other family): patch 16, a `position_grid`^2 grid of learned position embeddings, every 4th decoder
  layer full attention (every 2nd for a depth that 4 does not divide; the last layer for one of odd depth), the
  linear layers with the attention's heads and head dim, rotary on half of each head (a quarter of a tiny head
  would leave the visual tokens' height / width bands one frequency each)."""
  v, t = cfg.vision, cfg.text
  same = lambda c, *names: {n: getattr(c, n) for n in names}
  layers = t.num_hidden_layers
  interval = 4 if layers % 4 == 0 else 2 if layers % 2 == 0 else layers
  vision = same(v, "depth", "hidden_size", "intermediate_size", "num_heads", "out_hidden_size")
  text = same(t, "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
  text |= same(t, "num_key_value_heads", "head_dim", "rope_theta", "max_position_embeddings", "tie_word_embeddings")
  return Qwen35Config(
    vision=Qwen3VisionConfig(**vision, num_position_embeddings=position_grid**2, deepstack_visual_indexes=()),
    text=Qwen35TextConfig(
      **text,
      partial_rotary_factor=0.5,
      mrope_section=_sections(t.head_dim // 2),
      linear_num_key_heads=t.num_key_value_heads,
      linear_num_value_heads=t.num_attention_heads,
      linear_key_head_dim=t.head_dim,
      linear_value_head_dim=t.head_dim,
      layer_types=interval_layer_types(layers, interval),
    ),
    **{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name not in ("vision", "text")},
  )


def _preset(vision: dict, text: dict, **overrides) -> Qwen35Config:
  return Qwen35Config(
    vision=Qwen3VisionConfig(**vision, deepstack_visual_indexes=()), text=Qwen35TextConfig(**text), **overrides
  )


# The dense checkpoints' config.json values as public configs quote them (Qwen3.5-4B through a fine-tune of it,
# Qwen3.5-9B), not read from the Hub in this repo: every decoder 8 blocks of (3 Gated DeltaNet, 1 gated attention),
# head 256 with a quarter rotary, linear attention of 16 key / 32 value heads of 128. Qwen3.5-2B is left out: no
# full config of it could be checked here.
_LINEAR = dict(linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128)
_TEXT = dict(num_hidden_layers=32, num_attention_heads=16, num_key_value_heads=4, head_dim=256, **_LINEAR)


def qwen35_4b(**overrides) -> Qwen35Config:
  """Qwen3.5-4B (tied head, the 24-block ViT)."""
  vision = dict(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16, out_hidden_size=2560)
  return _preset(vision, dict(hidden_size=2560, intermediate_size=9216, tie_word_embeddings=True, **_TEXT), **overrides)


def qwen35_9b(**overrides) -> Qwen35Config:
  """Qwen3.5-9B (untied head, the 27-block ViT)."""
  vision = dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, out_hidden_size=4096)
  return _preset(
    vision, dict(hidden_size=4096, intermediate_size=12288, tie_word_embeddings=False, **_TEXT), **overrides
  )


def qwen35_tiny(vocab_size: int = 512, tie: bool = False, **overrides) -> Qwen35Config:
  """A tiny model with every architectural feature: two blocks of (linear, linear, full), GQA in both kinds (Hv =
  2 Hk in the linear layers), head_dim != hidden / heads, partial rotary, a 4x4 grid of position embeddings."""
  return _preset(
    dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, num_position_embeddings=16),
    dict(
      vocab_size=vocab_size,
      hidden_size=64,
      intermediate_size=128,
      num_hidden_layers=6,
      num_attention_heads=4,
      num_key_value_heads=2,
      head_dim=32,
      partial_rotary_factor=0.5,
      mrope_section=(3, 3, 2),
      linear_num_key_heads=2,
      linear_num_value_heads=4,
      linear_key_head_dim=16,
      linear_value_head_dim=24,
      layer_types=interval_layer_types(6, 3),
      max_position_embeddings=4096,
      tie_word_embeddings=tie,
    ),
    image_token_id=vocab_size - 4,
    video_token_id=vocab_size - 3,
    vision_start_token_id=vocab_size - 6,
    vision_end_token_id=vocab_size - 5,
    bos_token_id=vocab_size - 8,
    eos_token_id=vocab_size - 7,
    **overrides,
  )


def qwen35_mid(**overrides) -> Qwen35Config:
  """A ~60M-parameter config for CPU benchmarks (the small checkpoints' ratios: 3 linear + 1 full per block, head
  256 scaled to 64 with a quarter rotary), token ids as `jaxcap.models.qwen25vl_presets.mid`'s."""
  return _preset(
    dict(
      depth=8,
      hidden_size=256,
      intermediate_size=1024,
      num_heads=4,
      out_hidden_size=512,
      num_position_embeddings=576,
    ),
    dict(
      vocab_size=32000,
      hidden_size=512,
      intermediate_size=1536,
      num_hidden_layers=8,
      num_attention_heads=8,
      num_key_value_heads=2,
      head_dim=64,
      mrope_section=(3, 3, 2),
      linear_num_key_heads=4,
      linear_num_value_heads=8,
      linear_key_head_dim=64,
      linear_value_head_dim=64,
      max_position_embeddings=32768,
      tie_word_embeddings=True,
    ),
    image_token_id=31995,
    video_token_id=31996,
    vision_start_token_id=31993,
    vision_end_token_id=31994,
    bos_token_id=31990,
    eos_token_id=31991,
    **overrides,
  )


PRESETS = {
  "qwen3.5-4b": qwen35_4b,
  "qwen3.5-9b": qwen35_9b,
  "tiny": qwen35_tiny,
  "mid": qwen35_mid,
}
