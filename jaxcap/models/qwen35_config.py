"""Architecture configs of Qwen3.5 (dense), convertible to and from a Hugging Face `config.json`.

Field names follow `transformers`' `Qwen3_5Config`. The text decoder is hybrid: `layer_types` interleaves Gated
DeltaNet layers ("linear_attention", the `linear_*` sizes) with gated full-attention layers ("full_attention"),
whose rotary covers the first `partial_rotary_factor` of each head (interleaved mRoPE). The vision tower is
Qwen3-VL's without DeepStack.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax.numpy as jnp

from jaxcap.models.qwen3vl_config import Qwen3TextConfig, Qwen3VisionConfig, Qwen3VLConfig

LINEAR, FULL = "linear_attention", "full_attention"


def interval_layer_types(num_layers: int, interval: int = 4) -> tuple[str, ...]:
  """transformers' default pattern: every `interval`-th layer full attention, the others linear."""
  return tuple(LINEAR if (i + 1) % interval else FULL for i in range(num_layers))


@dataclasses.dataclass(frozen=True)
class Qwen35TextConfig(Qwen3TextConfig):
  """The hybrid decoder. Full-attention layers: q_proj doubled into query and an output gate, zero-centred q / k
  RMSNorm, rotary on the first `rotary_dim` of each head. Linear layers: a causal depthwise conv over q / k / v
  (`linear_conv_kernel_dim` taps), then the gated delta rule over `linear_num_value_heads` heads of
  `linear_value_head_dim` (keys: `linear_num_key_heads` x `linear_key_head_dim`)."""

  vocab_size: int = 248320
  head_dim: int = 256
  rope_theta: float = 10000000.0
  mrope_section: tuple[int, int, int] = (11, 11, 10)
  max_position_embeddings: int = 262144
  tie_word_embeddings: bool = False
  partial_rotary_factor: float = 0.25
  linear_conv_kernel_dim: int = 4
  linear_key_head_dim: int = 128
  linear_value_head_dim: int = 128
  linear_num_key_heads: int = 16
  linear_num_value_heads: int = 32
  layer_types: tuple[str, ...] = ()  # empty: `interval_layer_types(num_hidden_layers)`

  def __post_init__(self):
    if not self.layer_types:
      object.__setattr__(self, "layer_types", interval_layer_types(self.num_hidden_layers))
    if len(self.layer_types) != self.num_hidden_layers or set(self.layer_types) - {LINEAR, FULL}:
      raise ValueError(
        f"layer_types must list {self.num_hidden_layers} entries of {LINEAR!r} / {FULL!r}, got {self.layer_types}"
      )
    if 2 * sum(self.mrope_section) != self.rotary_dim:
      raise ValueError(
        f"mrope_section {self.mrope_section} must sum to rotary_dim / 2 = {self.rotary_dim // 2} "
        f"(head_dim {self.head_dim} x partial_rotary_factor {self.partial_rotary_factor})"
      )
    if self.linear_num_value_heads % self.linear_num_key_heads:
      raise ValueError("linear_num_value_heads must be a multiple of linear_num_key_heads")

  @property
  def rotary_dim(self) -> int:
    return int(self.head_dim * self.partial_rotary_factor)

  def layer_indices(self, kind: str) -> tuple[int, ...]:
    """The decoder indices of the layers of `kind` (LINEAR or FULL), in order."""
    return tuple(i for i, t in enumerate(self.layer_types) if t == kind)

  @property
  def kv_layers(self) -> int:
    """The full-attention layers: the only ones with keys and values per token."""
    return len(self.layer_indices(FULL))

  def recurrent_bytes(self, dtype) -> int:
    """Bytes of one row's linear states (`LinearState`, every linear layer): the conv's last K - 1 inputs in the
    cache `dtype` and the float32 delta state, whatever the length."""
    conv = (self.linear_conv_kernel_dim - 1) * self.conv_dim * jnp.dtype(dtype).itemsize
    delta = self.linear_num_value_heads * self.linear_key_head_dim * self.linear_value_head_dim * 4
    return len(self.layer_indices(LINEAR)) * (conv + delta)

  @property
  def conv_dim(self) -> int:
    """Channels of a linear layer's conv: queries, keys, values."""
    return 2 * self.linear_num_key_heads * self.linear_key_head_dim + self.linear_value_dim

  @property
  def linear_value_dim(self) -> int:
    return self.linear_num_value_heads * self.linear_value_head_dim


@dataclasses.dataclass(frozen=True)
class Qwen35Config(Qwen3VLConfig):
  """Whole-model Qwen3.5 config; the numeric policy fields are `Qwen25VLConfig`'s."""

  vision: Qwen3VisionConfig = dataclasses.field(
    default_factory=lambda: Qwen3VisionConfig(out_hidden_size=4096, deepstack_visual_indexes=())
  )
  text: Qwen35TextConfig = dataclasses.field(default_factory=Qwen35TextConfig)
  image_token_id: int = 248056
  video_token_id: int = 248057
  vision_start_token_id: int = 248053
  vision_end_token_id: int = 248054
  eos_token_id: int = 248046

  @classmethod
  def from_hf_dict(cls, d: Mapping[str, Any], **overrides) -> "Qwen35Config":
    """Builds a config from a parsed Qwen3.5 `config.json`."""
    if d.get("model_type") != "qwen3_5":
      raise ValueError(f"config.json has model_type={d.get('model_type')!r}; Qwen35Config reads 'qwen3_5'.")
    tc, vc = dict(d.get("text_config") or {}), dict(d.get("vision_config") or {})
    rope = dict(tc.get("rope_parameters") or tc.get("rope_scaling") or {})
    if tc.get("attention_bias", False):
      raise ValueError("text_config.attention_bias=true is not supported (no released Qwen3.5 uses it)")
    if rope.get("rope_type", "default") != "default":
      raise ValueError(f"text_config rope_type={rope['rope_type']!r}: only the default mRoPE is supported")
    if not rope.get("mrope_interleaved", True):
      raise ValueError("text_config.rope_parameters.mrope_interleaved=false: Qwen3.5's mRoPE is interleaved")
    heads = tc.get("num_attention_heads", 16)
    layers = tc.get("num_hidden_layers", 32)
    types = tc.get("layer_types") or interval_layer_types(layers, tc.get("full_attention_interval", 4))
    text = Qwen35TextConfig(
      vocab_size=tc.get("vocab_size", 248320),
      hidden_size=tc.get("hidden_size", 4096),
      intermediate_size=tc.get("intermediate_size", 12288),
      num_hidden_layers=layers,
      num_attention_heads=heads,
      num_key_value_heads=tc.get("num_key_value_heads") or heads,
      head_dim=tc.get("head_dim") or tc.get("hidden_size", 4096) // heads,
      rms_norm_eps=tc.get("rms_norm_eps", 1e-6),
      rope_theta=float(rope.get("rope_theta", tc.get("rope_theta", 10000000.0))),
      mrope_section=tuple(rope.get("mrope_section", (11, 11, 10))),
      partial_rotary_factor=float(rope.get("partial_rotary_factor", tc.get("partial_rotary_factor", 0.25))),
      max_position_embeddings=tc.get("max_position_embeddings", 262144),
      hidden_act=tc.get("hidden_act", "silu"),
      tie_word_embeddings=bool(d.get("tie_word_embeddings", tc.get("tie_word_embeddings", False))),
      linear_conv_kernel_dim=tc.get("linear_conv_kernel_dim", 4),
      linear_key_head_dim=tc.get("linear_key_head_dim", 128),
      linear_value_head_dim=tc.get("linear_value_head_dim", 128),
      linear_num_key_heads=tc.get("linear_num_key_heads", 16),
      linear_num_value_heads=tc.get("linear_num_value_heads", 32),
      layer_types=tuple(types),
    )
    vision = Qwen3VisionConfig.from_hf_dict(vc, text.hidden_size, deepstack=False)
    if text.hidden_act != "silu":
      raise ValueError(f"text_config.hidden_act={text.hidden_act!r}: expected 'silu'")
    eos = tc.get("eos_token_id") or d.get("eos_token_id") or 248046
    return cls(
      vision=vision,
      text=text,
      image_token_id=d.get("image_token_id", 248056),
      video_token_id=d.get("video_token_id", 248057),
      vision_start_token_id=d.get("vision_start_token_id", 248053),
      vision_end_token_id=d.get("vision_end_token_id", 248054),
      bos_token_id=tc.get("bos_token_id") or 0,
      eos_token_id=eos[0] if isinstance(eos, (list, tuple)) else eos,
      **overrides,
    )

  def to_hf_dict(self) -> dict[str, Any]:
    """The nested `config.json` layout that `transformers`' Qwen3_5Config writes and reads."""
    t, v = self.text, self.vision
    dtype_name = jnp.dtype(self.param_dtype).name
    rope = {
      "rope_type": "default",
      "rope_theta": t.rope_theta,
      "mrope_section": list(t.mrope_section),
      "mrope_interleaved": True,
      "partial_rotary_factor": t.partial_rotary_factor,
    }
    return {
      "architectures": ["Qwen3_5ForConditionalGeneration"],
      "model_type": "qwen3_5",
      "image_token_id": self.image_token_id,
      "video_token_id": self.video_token_id,
      "vision_start_token_id": self.vision_start_token_id,
      "vision_end_token_id": self.vision_end_token_id,
      "tie_word_embeddings": t.tie_word_embeddings,
      "dtype": dtype_name,
      "text_config": {
        "model_type": "qwen3_5_text",
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
        "rope_parameters": rope,
        "linear_conv_kernel_dim": t.linear_conv_kernel_dim,
        "linear_key_head_dim": t.linear_key_head_dim,
        "linear_value_head_dim": t.linear_value_head_dim,
        "linear_num_key_heads": t.linear_num_key_heads,
        "linear_num_value_heads": t.linear_num_value_heads,
        "layer_types": list(t.layer_types),
        "dtype": dtype_name,
      },
      "vision_config": v.to_hf_dict("qwen3_5_vision", dtype_name, deepstack=False),
    }
