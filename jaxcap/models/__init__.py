"""Qwen2.5-VL in Flax: configs, the model, multimodal position ids."""

from jaxcap.models.config import PRESETS, Qwen25VLConfig, TextConfig, VisionConfig, mid, qwen25vl_3b, qwen25vl_7b, tiny
from jaxcap.models.qwen25vl import KVCache, Qwen25VL, VisionInput
from jaxcap.models.rope_index import rope_index
from jaxcap.models.vision import VisionLayout, vision_layout
