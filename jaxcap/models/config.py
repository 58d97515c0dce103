"""Architecture configs of Qwen2.5-VL, convertible to and from a Hugging Face `config.json`.

The field names follow `transformers`' `Qwen2_5_VLConfig` so that a checkpoint's config maps one to one.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class VisionConfig:
  """The ViT with window attention and a 2x2 patch merger."""

  depth: int = 32
  hidden_size: int = 1280
  intermediate_size: int = 3420
  num_heads: int = 16
  in_channels: int = 3
  patch_size: int = 14
  spatial_merge_size: int = 2
  temporal_patch_size: int = 2
  tokens_per_second: int = 2
  window_size: int = 112
  out_hidden_size: int = 2048
  fullatt_block_indexes: tuple[int, ...] = (7, 15, 23, 31)
  rope_theta: float = 10000.0
  hidden_act: str = "silu"

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def patch_dim(self) -> int:
    """Length of one flattened patch: channels x temporal_patch x patch^2."""
    return self.in_channels * self.temporal_patch_size * self.patch_size**2


@dataclasses.dataclass(frozen=True)
class TextConfig:
  """The Qwen2 decoder with multimodal RoPE."""

  vocab_size: int = 151936
  hidden_size: int = 2048
  intermediate_size: int = 11008
  num_hidden_layers: int = 36
  num_attention_heads: int = 16
  num_key_value_heads: int = 2
  rms_norm_eps: float = 1e-6
  rope_theta: float = 1000000.0
  mrope_section: tuple[int, int, int] = (16, 24, 24)
  max_position_embeddings: int = 128000
  hidden_act: str = "silu"
  tie_word_embeddings: bool = True
  # Variants of the shared decoder (jaxcap.models.decoder / layers), set by the family's config: Qwen2 has q/k/v
  # biases; Qwen3 has none but an RMSNorm of each query / key head, and interleaved mRoPE bands.
  qkv_bias: bool = True
  qk_norm: bool = False
  mrope_interleaved: bool = False

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_attention_heads

  @property
  def kv_layers(self) -> int:
    """Decoder layers that keep keys and values per token (a KV cache's or the paged engine's pool's layers):
    every layer."""
    return self.num_hidden_layers

  def recurrent_bytes(self, dtype) -> int:
    """Bytes of one row's fixed-size recurrent state (the decoder's layers without a KV cache; the cache `dtype`):
    none here (Qwen3.5's linear layers: `Qwen35TextConfig`)."""
    return 0


@dataclasses.dataclass(frozen=True)
class Qwen25VLConfig:
  """Whole-model config: towers, special token ids and the numeric policy.

  `dtype` is the matmul/activation dtype, `param_dtype` the storage dtype of the weights; softmax, norms,
  rotary embeddings and logits are always computed in float32.
  """

  vision: VisionConfig = dataclasses.field(default_factory=VisionConfig)
  text: TextConfig = dataclasses.field(default_factory=TextConfig)
  image_token_id: int = 151655
  video_token_id: int = 151656
  vision_start_token_id: int = 151652
  vision_end_token_id: int = 151653
  bos_token_id: int = 151643
  eos_token_id: int = 151645
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  remat: str = "none"  # "none" | "full" | "dots": activation checkpointing of each decoder / vision block.
  # Positions per chunk of the LM head in log-prob passes: the float32 logits of one chunk, [sequences, chunk,
  # vocab], are the largest temporary of a training step at a 152k vocabulary; lower it on small-memory chips.
  logprob_chunk: int = 256
  # Training passes run each prompt through the decoder once for its G completions (`shared_decode`), not once per
  # completion: the same values, B x P + N x C positions instead of N x (P + C).
  share_prompt: bool = True
  # Layer stacks under lax.scan: compile time flat in depth (the 3B RL step: 18 s instead of 102 s on CPU).
  # False unrolls them: ~13% faster training of a small model on CPU, compile time grows with depth.
  scan_layers: bool = True

  def replace(self, **changes) -> "Qwen25VLConfig":
    return dataclasses.replace(self, **changes)

  # ------------------------------------------------------------------ HF config.json round trip
  @classmethod
  def from_hf_dict(cls, d: Mapping[str, Any], **overrides) -> "Qwen25VLConfig":
    """Builds a config from a parsed Qwen2.5-VL `config.json` (old flat or new nested layout)."""
    if d.get("model_type") not in ("qwen2_5_vl", None):
      raise ValueError(
        f"config.json has model_type={d.get('model_type')!r}; jaxcap loads Qwen2.5-VL checkpoints "
        "(model_type 'qwen2_5_vl'). Point to a Qwen2.5-VL-*-Instruct directory."
      )
    tc = dict(d.get("text_config") or {})
    for k, v in d.items():  # old checkpoints keep the text fields at the top level
      tc.setdefault(k, v)
    vc = dict(d.get("vision_config") or {})
    rope = dict(tc.get("rope_parameters") or tc.get("rope_scaling") or {})
    text = TextConfig(
      vocab_size=tc["vocab_size"],
      hidden_size=tc["hidden_size"],
      intermediate_size=tc["intermediate_size"],
      num_hidden_layers=tc["num_hidden_layers"],
      num_attention_heads=tc["num_attention_heads"],
      num_key_value_heads=tc.get("num_key_value_heads") or tc["num_attention_heads"],
      rms_norm_eps=tc.get("rms_norm_eps", 1e-6),
      rope_theta=float(rope.get("rope_theta", tc.get("rope_theta", 1000000.0))),
      mrope_section=tuple(rope.get("mrope_section", (16, 24, 24))),
      max_position_embeddings=tc.get("max_position_embeddings", 128000),
      hidden_act=tc.get("hidden_act", "silu"),
      tie_word_embeddings=bool(d.get("tie_word_embeddings", tc.get("tie_word_embeddings", False))),
    )
    vrope = dict(vc.get("rope_parameters") or {})
    vision = VisionConfig(
      depth=vc.get("depth", 32),
      hidden_size=vc.get("hidden_size", 1280),
      intermediate_size=vc.get("intermediate_size", 3420),
      num_heads=vc.get("num_heads", 16),
      in_channels=vc.get("in_channels", vc.get("in_chans", 3)),
      patch_size=vc.get("patch_size", 14),
      spatial_merge_size=vc.get("spatial_merge_size", 2),
      temporal_patch_size=vc.get("temporal_patch_size", 2),
      tokens_per_second=vc.get("tokens_per_second", 2),
      window_size=vc.get("window_size", 112),
      out_hidden_size=vc.get("out_hidden_size", text.hidden_size),
      fullatt_block_indexes=tuple(vc.get("fullatt_block_indexes", (7, 15, 23, 31))),
      rope_theta=float(vrope.get("rope_theta", 10000.0)),
      hidden_act=vc.get("hidden_act", "silu"),
    )
    if text.hidden_act != "silu" or vision.hidden_act != "silu":
      raise ValueError(f"only hidden_act='silu' is supported, got {text.hidden_act!r}/{vision.hidden_act!r}")
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
    """The nested `config.json` layout that current `transformers` writes and reads."""
    t, v = self.text, self.vision
    dtype_name = jnp.dtype(self.param_dtype).name
    return {
      "architectures": ["Qwen2_5_VLForConditionalGeneration"],
      "model_type": "qwen2_5_vl",
      "image_token_id": self.image_token_id,
      "video_token_id": self.video_token_id,
      "vision_start_token_id": self.vision_start_token_id,
      "vision_end_token_id": self.vision_end_token_id,
      "tie_word_embeddings": t.tie_word_embeddings,
      "dtype": dtype_name,
      "text_config": {
        "model_type": "qwen2_5_vl_text",
        "vocab_size": t.vocab_size,
        "hidden_size": t.hidden_size,
        "intermediate_size": t.intermediate_size,
        "num_hidden_layers": t.num_hidden_layers,
        "num_attention_heads": t.num_attention_heads,
        "num_key_value_heads": t.num_key_value_heads,
        "rms_norm_eps": t.rms_norm_eps,
        "max_position_embeddings": t.max_position_embeddings,
        "hidden_act": t.hidden_act,
        "tie_word_embeddings": t.tie_word_embeddings,
        "bos_token_id": self.bos_token_id,
        "eos_token_id": self.eos_token_id,
        "rope_parameters": {"rope_type": "default", "rope_theta": t.rope_theta, "mrope_section": list(t.mrope_section)},
        "dtype": dtype_name,
      },
      "vision_config": {
        "model_type": "qwen2_5_vl_vision",
        "depth": v.depth,
        "hidden_size": v.hidden_size,
        "intermediate_size": v.intermediate_size,
        "num_heads": v.num_heads,
        "in_channels": v.in_channels,
        "patch_size": v.patch_size,
        "spatial_merge_size": v.spatial_merge_size,
        "temporal_patch_size": v.temporal_patch_size,
        "tokens_per_second": v.tokens_per_second,
        "window_size": v.window_size,
        "out_hidden_size": v.out_hidden_size,
        "fullatt_block_indexes": list(v.fullatt_block_indexes),
        "hidden_act": v.hidden_act,
        "rope_parameters": {"rope_type": "axial", "rope_theta": v.rope_theta},
        "dtype": dtype_name,
      },
    }


def dtype_from_name(name: str):
  """'float32' / 'bfloat16' (config spelling) -> the jnp scalar type."""
  dtypes = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
  if name not in dtypes:
    raise ValueError(f"dtype {name!r}: use float32 or bfloat16")
  return dtypes[name]
