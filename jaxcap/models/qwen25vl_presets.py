"""Qwen2.5-VL presets: the released 3B / 7B checkpoints' configs, and `tiny` (tests) / `mid` (benchmarks) models of
the same architecture."""

from __future__ import annotations

from jaxcap.models.config import Qwen25VLConfig, TextConfig, VisionConfig


def qwen25vl_3b(**overrides) -> Qwen25VLConfig:
  """Qwen2.5-VL-3B-Instruct (numbers from its config.json)."""
  return Qwen25VLConfig(
    vision=VisionConfig(
      depth=32,
      hidden_size=1280,
      intermediate_size=3420,
      num_heads=16,
      out_hidden_size=2048,
      fullatt_block_indexes=(7, 15, 23, 31),
      tokens_per_second=2,
    ),
    text=TextConfig(
      vocab_size=151936,
      hidden_size=2048,
      intermediate_size=11008,
      num_hidden_layers=36,
      num_attention_heads=16,
      num_key_value_heads=2,
      rope_theta=1000000.0,
      max_position_embeddings=128000,
      tie_word_embeddings=True,
    ),
    **overrides,
  )


def qwen25vl_7b(**overrides) -> Qwen25VLConfig:
  """Qwen2.5-VL-7B-Instruct (numbers from its config.json)."""
  return Qwen25VLConfig(
    vision=VisionConfig(
      depth=32,
      hidden_size=1280,
      intermediate_size=3420,
      num_heads=16,
      out_hidden_size=3584,
      fullatt_block_indexes=(7, 15, 23, 31),
      tokens_per_second=2,
    ),
    text=TextConfig(
      vocab_size=152064,
      hidden_size=3584,
      intermediate_size=18944,
      num_hidden_layers=28,
      num_attention_heads=28,
      num_key_value_heads=4,
      rope_theta=1000000.0,
      max_position_embeddings=128000,
      tie_word_embeddings=False,
    ),
    **overrides,
  )


def tiny(vocab_size: int = 512, **overrides) -> Qwen25VLConfig:
  """A few-hundred-thousand-parameter model with every architectural feature (GQA, window + full attention)."""
  return Qwen25VLConfig(
    vision=VisionConfig(
      depth=4,
      hidden_size=32,
      intermediate_size=64,
      num_heads=2,
      out_hidden_size=64,
      fullatt_block_indexes=(1, 3),
      window_size=56,
      tokens_per_second=2,
    ),
    text=TextConfig(
      vocab_size=vocab_size,
      hidden_size=64,
      intermediate_size=128,
      num_hidden_layers=2,
      num_attention_heads=4,
      num_key_value_heads=2,
      mrope_section=(2, 3, 3),
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


def mid(**overrides) -> Qwen25VLConfig:
  """A ~60M-parameter config for CPU benchmarks (same shape ratios as the 3B)."""
  return Qwen25VLConfig(
    vision=VisionConfig(
      depth=8,
      hidden_size=256,
      intermediate_size=684,
      num_heads=4,
      out_hidden_size=512,
      fullatt_block_indexes=(3, 7),
      tokens_per_second=2,
    ),
    text=TextConfig(
      vocab_size=32000,
      hidden_size=512,
      intermediate_size=2752,
      num_hidden_layers=8,
      num_attention_heads=8,
      num_key_value_heads=2,
      mrope_section=(8, 12, 12),
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


PRESETS = {"qwen2.5-vl-3b": qwen25vl_3b, "qwen2.5-vl-7b": qwen25vl_7b, "tiny": tiny, "mid": mid}
