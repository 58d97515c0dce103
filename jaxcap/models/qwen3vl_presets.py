"""Qwen3-VL presets: the dense Instruct checkpoints' shapes, tiny / mid configs for tests and benchmarks, and the
embedded student's Qwen3-VL twin of a Qwen2.5-VL config (`qwen3vl_like`)."""

from __future__ import annotations

import dataclasses

from jaxcap.models.config import Qwen25VLConfig
from jaxcap.models.qwen3vl_config import Qwen3TextConfig, Qwen3VisionConfig, Qwen3VLConfig


def qwen3vl_like(cfg: Qwen25VLConfig, position_grid: int = 4) -> Qwen3VLConfig:
  """The Qwen3-VL config of the same widths, depths and token ids as the Qwen2.5-VL config `cfg` (the embedded
  student's other family): patch 16, a `position_grid`^2 grid of learned position embeddings, DeepStack after the
  first ViT block (when there are two or more), the Qwen3 decoder (q / k RMSNorm, no q / k / v biases, interleaved
  mRoPE in Qwen3-VL's band proportions 24 : 20 : 20)."""
  v, t = cfg.vision, cfg.text
  same = lambda c, *names: {n: getattr(c, n) for n in names}
  half = t.head_dim // 2
  hw = half * 20 // 64
  vision = same(v, "depth", "hidden_size", "intermediate_size", "num_heads", "out_hidden_size")
  text = same(t, "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
  text |= same(t, "num_key_value_heads", "head_dim", "rope_theta", "max_position_embeddings", "tie_word_embeddings")
  return Qwen3VLConfig(
    vision=Qwen3VisionConfig(
      **vision, num_position_embeddings=position_grid**2, deepstack_visual_indexes=(0,) if v.depth > 1 else ()
    ),
    text=Qwen3TextConfig(**text, mrope_section=(half - 2 * hw, hw, hw)),
    **{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name not in ("vision", "text")},
  )


def _preset(vision: dict, text: dict, **overrides) -> Qwen3VLConfig:
  return Qwen3VLConfig(vision=Qwen3VisionConfig(**vision), text=Qwen3TextConfig(**text), **overrides)


# The three dense Instruct checkpoints' config.json values (as recalled; not read from the Hub in this repo).
_SMALL_VIT = dict(
  depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16, deepstack_visual_indexes=(5, 11, 17)
)


def qwen3vl_2b(**overrides) -> Qwen3VLConfig:
  """Qwen3-VL-2B-Instruct."""
  text = dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16)
  return _preset(
    _SMALL_VIT | dict(out_hidden_size=2048),
    text | dict(num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    **overrides,
  )


def qwen3vl_4b(**overrides) -> Qwen3VLConfig:
  """Qwen3-VL-4B-Instruct."""
  text = dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32)
  return _preset(
    _SMALL_VIT | dict(out_hidden_size=2560),
    text | dict(num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    **overrides,
  )


def qwen3vl_8b(**overrides) -> Qwen3VLConfig:
  """Qwen3-VL-8B-Instruct."""
  vision = dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, out_hidden_size=4096)
  text = dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32)
  return _preset(
    vision | dict(deepstack_visual_indexes=(8, 16, 24)),
    text | dict(num_key_value_heads=8, head_dim=128, tie_word_embeddings=False),
    **overrides,
  )


def qwen3vl_tiny(vocab_size: int = 512, **overrides) -> Qwen3VLConfig:
  """A tiny model with every architectural feature: GQA, head_dim != hidden / heads, 2 DeepStack layers, a 4x4
  grid of learned position embeddings (resampled to every image size)."""
  return _preset(
    dict(
      depth=3,
      hidden_size=32,
      intermediate_size=64,
      num_heads=2,
      out_hidden_size=64,
      num_position_embeddings=16,
      deepstack_visual_indexes=(0, 1),
    ),
    dict(
      vocab_size=vocab_size,
      hidden_size=64,
      intermediate_size=128,
      num_hidden_layers=3,
      num_attention_heads=4,
      num_key_value_heads=2,
      head_dim=24,
      mrope_section=(4, 4, 4),
      max_position_embeddings=4096,
      tie_word_embeddings=False,
    ),
    image_token_id=vocab_size - 4,
    video_token_id=vocab_size - 3,
    vision_start_token_id=vocab_size - 6,
    vision_end_token_id=vocab_size - 5,
    bos_token_id=vocab_size - 8,
    eos_token_id=vocab_size - 7,
    **overrides,
  )


def qwen3vl_mid(**overrides) -> Qwen3VLConfig:
  """A 54M-parameter config for CPU benchmarks (the 2B's shape ratios: mRoPE sections, DeepStack every 6 of 24
  blocks scaled to 8), token ids as `jaxcap.models.qwen25vl_presets.mid`'s."""
  return _preset(
    dict(
      depth=8,
      hidden_size=256,
      intermediate_size=1024,
      num_heads=4,
      out_hidden_size=512,
      num_position_embeddings=576,
      deepstack_visual_indexes=(1, 3, 5),
    ),
    dict(
      vocab_size=32000,
      hidden_size=512,
      intermediate_size=1536,
      num_hidden_layers=8,
      num_attention_heads=8,
      num_key_value_heads=2,
      head_dim=64,
      mrope_section=(12, 10, 10),
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
  "qwen3-vl-2b": qwen3vl_2b,
  "qwen3-vl-4b": qwen3vl_4b,
  "qwen3-vl-8b": qwen3vl_8b,
  "tiny": qwen3vl_tiny,
  "mid": qwen3vl_mid,
}
