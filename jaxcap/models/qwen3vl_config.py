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

  @classmethod
  def from_hf_dict(cls, vc: Mapping[str, Any], out_hidden_size: int, deepstack: bool = True) -> "Qwen3VisionConfig":
    """The tower of a parsed `vision_config` (Qwen3-VL's, or with `deepstack=False` Qwen3.5's, which has none);
    `out_hidden_size`: the default width of its merged features (the decoder's)."""
    vrope = dict(vc.get("rope_parameters") or {})
    vision = cls(
      depth=vc.get("depth", 27),
      hidden_size=vc.get("hidden_size", 1152),
      intermediate_size=vc.get("intermediate_size", 4304),
      num_heads=vc.get("num_heads", 16),
      in_channels=vc.get("in_channels", 3),
      patch_size=vc.get("patch_size", 16),
      spatial_merge_size=vc.get("spatial_merge_size", 2),
      temporal_patch_size=vc.get("temporal_patch_size", 2),
      out_hidden_size=vc.get("out_hidden_size", out_hidden_size),
      num_position_embeddings=vc.get("num_position_embeddings", 2304),
      deepstack_visual_indexes=tuple(vc.get("deepstack_visual_indexes", (8, 16, 24))) if deepstack else (),
      rope_theta=float(vrope.get("rope_theta", 10000.0)),
      hidden_act=vc.get("hidden_act", "gelu_pytorch_tanh"),
    )
    if vision.hidden_act != "gelu_pytorch_tanh":
      raise ValueError(f"vision_config.hidden_act={vision.hidden_act!r}: expected 'gelu_pytorch_tanh'")
    if vision.grid_side**2 != vision.num_position_embeddings:
      raise ValueError(f"vision_config.num_position_embeddings={vision.num_position_embeddings} is not a square")
    return vision

  def to_hf_dict(self, model_type: str, dtype_name: str, deepstack: bool = True) -> dict[str, Any]:
    """The `vision_config` transformers reads (`deepstack=False`: without the DeepStack field, as Qwen3.5's)."""
    d = {
      "model_type": model_type,
      "depth": self.depth,
      "hidden_size": self.hidden_size,
      "intermediate_size": self.intermediate_size,
      "num_heads": self.num_heads,
      "in_channels": self.in_channels,
      "patch_size": self.patch_size,
      "spatial_merge_size": self.spatial_merge_size,
      "temporal_patch_size": self.temporal_patch_size,
      "out_hidden_size": self.out_hidden_size,
      "num_position_embeddings": self.num_position_embeddings,
    }
    if deepstack:
      d["deepstack_visual_indexes"] = list(self.deepstack_visual_indexes)
    rope = {"rope_type": "axial", "rope_theta": self.rope_theta}
    return d | {"hidden_act": self.hidden_act, "rope_parameters": rope, "dtype": dtype_name}


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
    vision = Qwen3VisionConfig.from_hf_dict(vc, text.hidden_size)
    if text.hidden_act != "silu":
      raise ValueError(f"text_config.hidden_act={text.hidden_act!r}: expected 'silu'")
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
      "vision_config": v.to_hf_dict("qwen3_vl_vision", dtype_name),
    }


# ---------------------------------------------------------------------- presets
