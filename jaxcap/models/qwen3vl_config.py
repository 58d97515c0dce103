"""Architecture configs of Qwen3-VL (dense), convertible to and from a Hugging Face `config.json`.

Field names follow `transformers`' `Qwen3VLConfig`. The whole-model config extends `Qwen25VLConfig` (same token
ids and numeric policy fields), so code written against that one reads a Qwen3-VL config unchanged.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax.numpy as jnp

from jaxcap.models.config import Qwen25VLConfig, TextConfig


@dataclasses.dataclass(frozen=True)
class Qwen3VisionConfig:
  """The ViT: patch 16, learned position embeddings (a square grid, bilinearly resampled to each image) beside
  2-D rotary, LayerNorm blocks with a GELU MLP, full attention per frame; a 2x2 merger, and one more merger per
  DeepStack layer (`deepstack_visual_indexes`)."""

  depth: int = 27
  hidden_size: int = 1152
  intermediate_size: int = 4304
  num_heads: int = 16
  in_channels: int = 3
  patch_size: int = 16
  spatial_merge_size: int = 2
  temporal_patch_size: int = 2
  out_hidden_size: int = 4096
  num_position_embeddings: int = 2304
  deepstack_visual_indexes: tuple[int, ...] = (8, 16, 24)
  rope_theta: float = 10000.0
  hidden_act: str = "gelu_pytorch_tanh"
  # video frames are separated by text timestamps: no time scaling of the temporal position id (jaxcap.models.
  # rope_index reads it for Qwen2.5-VL videos; Qwen3-VL's frames are one temporal patch each)
  tokens_per_second: int = 2

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def patch_dim(self) -> int:
    """Length of one flattened patch: channels x temporal_patch x patch^2."""
    return self.in_channels * self.temporal_patch_size * self.patch_size**2

  @property
  def grid_side(self) -> int:
    """Side of the square grid of learned position embeddings."""
    return int(self.num_position_embeddings**0.5)


@dataclasses.dataclass(frozen=True)
class Qwen3TextConfig(TextConfig):
  """The Qwen3 decoder: an explicit head_dim, no q/k/v biases, q/k RMSNorm, interleaved mRoPE."""

  head_dim: int = 128  # a field here (hidden_size / heads in Qwen2)
  rope_theta: float = 5000000.0
  mrope_section: tuple[int, int, int] = (24, 20, 20)
  max_position_embeddings: int = 262144
  qkv_bias: bool = False
  qk_norm: bool = True
  mrope_interleaved: bool = True


@dataclasses.dataclass(frozen=True)
class Qwen3VLConfig(Qwen25VLConfig):
  """Whole-model Qwen3-VL config; the numeric policy fields are `Qwen25VLConfig`'s."""

  vision: Qwen3VisionConfig = dataclasses.field(default_factory=Qwen3VisionConfig)
  text: Qwen3TextConfig = dataclasses.field(default_factory=Qwen3TextConfig)

  @classmethod
  def from_hf_dict(cls, d: Mapping[str, Any], **overrides) -> "Qwen3VLConfig":
    """Builds a config from a parsed Qwen3-VL `config.json`."""
    if d.get("model_type") != "qwen3_vl":
      raise ValueError(f"config.json has model_type={d.get('model_type')!r}; Qwen3VLConfig reads 'qwen3_vl'.")
    tc, vc = dict(d.get("text_config") or {}), dict(d.get("vision_config") or {})
    rope = dict(tc.get("rope_parameters") or tc.get("rope_scaling") or {})
    if tc.get("attention_bias", False):
      raise ValueError("text_config.attention_bias=true is not supported (no released Qwen3-VL uses it)")
    if rope.get("rope_type", "default") != "default":
      raise ValueError(f"text_config rope_type={rope['rope_type']!r}: only the default mRoPE is supported")
    heads = tc.get("num_attention_heads", 32)
    text = Qwen3TextConfig(
      vocab_size=tc.get("vocab_size", 151936),
      hidden_size=tc.get("hidden_size", 4096),
      intermediate_size=tc.get("intermediate_size", 22016),
      num_hidden_layers=tc.get("num_hidden_layers", 32),
      num_attention_heads=heads,
      num_key_value_heads=tc.get("num_key_value_heads") or heads,
      head_dim=tc.get("head_dim") or tc.get("hidden_size", 4096) // heads,
      rms_norm_eps=tc.get("rms_norm_eps", 1e-6),
      rope_theta=float(rope.get("rope_theta", tc.get("rope_theta", 5000000.0))),
      mrope_section=tuple(rope.get("mrope_section", (24, 20, 20))),
      mrope_interleaved=bool(rope.get("mrope_interleaved", True)),
      max_position_embeddings=tc.get("max_position_embeddings", 262144),
      hidden_act=tc.get("hidden_act", "silu"),
      tie_word_embeddings=bool(d.get("tie_word_embeddings", tc.get("tie_word_embeddings", False))),
    )
    if not text.mrope_interleaved:
      raise ValueError("text_config.rope_parameters.mrope_interleaved=false: Qwen3-VL's mRoPE is interleaved")
    vrope = dict(vc.get("rope_parameters") or {})
    vision = Qwen3VisionConfig(
      depth=vc.get("depth", 27),
      hidden_size=vc.get("hidden_size", 1152),
      intermediate_size=vc.get("intermediate_size", 4304),
      num_heads=vc.get("num_heads", 16),
      in_channels=vc.get("in_channels", 3),
      patch_size=vc.get("patch_size", 16),
      spatial_merge_size=vc.get("spatial_merge_size", 2),
      temporal_patch_size=vc.get("temporal_patch_size", 2),
      out_hidden_size=vc.get("out_hidden_size", text.hidden_size),
      num_position_embeddings=vc.get("num_position_embeddings", 2304),
      deepstack_visual_indexes=tuple(vc.get("deepstack_visual_indexes", (8, 16, 24))),
      rope_theta=float(vrope.get("rope_theta", 10000.0)),
      hidden_act=vc.get("hidden_act", "gelu_pytorch_tanh"),
    )
    if text.hidden_act != "silu" or vision.hidden_act != "gelu_pytorch_tanh":
      raise ValueError(f"hidden_act {text.hidden_act!r}/{vision.hidden_act!r}: expected 'silu'/'gelu_pytorch_tanh'")
    if vision.grid_side**2 != vision.num_position_embeddings:
      raise ValueError(f"vision_config.num_position_embeddings={vision.num_position_embeddings} is not a square")
    eos = tc.get("eos_token_id", 151645)
    return cls(
      vision=vision,
      text=text,
      image_token_id=d.get("image_token_id", 151655),
      video_token_id=d.get("video_token_id", 151656),
      vision_start_token_id=d.get("vision_start_token_id", 151652),
      vision_end_token_id=d.get("vision_end_token_id", 151653),
      bos_token_id=tc.get("bos_token_id", 151643) or 0,
      eos_token_id=eos[0] if isinstance(eos, (list, tuple)) else eos,
      **overrides,
    )

  def to_hf_dict(self) -> dict[str, Any]:
    """The nested `config.json` layout that `transformers`' Qwen3VLConfig writes and reads."""
    t, v = self.text, self.vision
    dtype_name = jnp.dtype(self.param_dtype).name
    rope = {"rope_type": "default", "rope_theta": t.rope_theta, "mrope_section": list(t.mrope_section)}
    return {
      "architectures": ["Qwen3VLForConditionalGeneration"],
      "model_type": "qwen3_vl",
      "image_token_id": self.image_token_id,
      "video_token_id": self.video_token_id,
      "vision_start_token_id": self.vision_start_token_id,
      "vision_end_token_id": self.vision_end_token_id,
      "tie_word_embeddings": t.tie_word_embeddings,
      "dtype": dtype_name,
      "text_config": {
        "model_type": "qwen3_vl_text",
        "vocab_size": t.vocab_size,
        "hidden_size": t.hidden_size,
        "intermediate_size": t.intermediate_size,
        "num_hidden_layers": t.num_hidden_layers,
        "num_attention_heads": t.num_attention_heads,
        "num_key_value_heads": t.num_key_value_heads,
        "head_dim": t.head_dim,
        "rms_norm_eps": t.rms_norm_eps,
        "max_position_embeddings": t.max_position_embeddings,
        "hidden_act": t.hidden_act,
        "attention_bias": False,
        "tie_word_embeddings": t.tie_word_embeddings,
        "bos_token_id": self.bos_token_id,
        "eos_token_id": self.eos_token_id,
        "rope_parameters": rope | {"mrope_interleaved": True},
        "dtype": dtype_name,
      },
      "vision_config": {
        "model_type": "qwen3_vl_vision",
        "depth": v.depth,
        "hidden_size": v.hidden_size,
        "intermediate_size": v.intermediate_size,
        "num_heads": v.num_heads,
        "in_channels": v.in_channels,
        "patch_size": v.patch_size,
        "spatial_merge_size": v.spatial_merge_size,
        "temporal_patch_size": v.temporal_patch_size,
        "out_hidden_size": v.out_hidden_size,
        "num_position_embeddings": v.num_position_embeddings,
        "deepstack_visual_indexes": list(v.deepstack_visual_indexes),
        "hidden_act": v.hidden_act,
        "rope_parameters": {"rope_type": "axial", "rope_theta": v.rope_theta},
        "dtype": dtype_name,
      },
    }


# ---------------------------------------------------------------------- presets
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
  blocks scaled to 8), token ids as `jaxcap.models.config.mid`'s."""
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
