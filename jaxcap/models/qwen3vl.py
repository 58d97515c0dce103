"""Qwen3-VL (dense) in Flax NNX: `Qwen3VLForConditionalGeneration` semantics, param names mirroring HF's.

The Qwen2.5-VL model with its variants switched by the config: the Qwen3 decoder (q/k RMSNorm, no q/k/v biases,
interleaved mRoPE: flags of `Qwen3TextConfig` read by the shared `jaxcap.models.decoder`), the Qwen3 vision tower
(`qwen3vl_vision`), and DeepStack: the tower's intermediate features, added to the outputs of the first decoder
layers at the visual tokens (`Qwen25VL.decode(..., deepstack=)`; prefill only, decode steps carry no vision).
"""

from __future__ import annotations

from flax import nnx

from jaxcap.models.qwen25vl import Qwen25VL
from jaxcap.models.qwen3vl_config import Qwen3VLConfig
from jaxcap.models.qwen3vl_vision import Qwen3VisionTower


class Qwen3VL(Qwen25VL):
  """The Qwen3-VL student: the Qwen2.5-VL module with the Qwen3 vision tower, whose features carry the DeepStack
  additions that `embed_vision` places and `decode(..., deepstack=)` adds."""

  @staticmethod
  def vision_tower(cfg: Qwen3VLConfig, rngs: nnx.Rngs) -> nnx.Module:
    return Qwen3VisionTower(
      cfg.vision, dtype=cfg.dtype, param_dtype=cfg.param_dtype, remat=cfg.remat, unroll=not cfg.scan_layers, rngs=rngs
    )
