"""The student families in Flax (Qwen2.5-VL, Qwen3-VL): configs, the models, multimodal position ids."""

from jaxcap.models.config import Qwen25VLConfig, TextConfig, VisionConfig
from jaxcap.models.qwen25vl_presets import PRESETS, mid, qwen25vl_3b, qwen25vl_7b, tiny
from jaxcap.models.qwen25vl import KVCache, Qwen25VL, VisionInput
from jaxcap.models.rope_index import rope_index
from jaxcap.models.vision import VisionLayout, vision_layout
from jaxcap.models.qwen3vl import Qwen3VL
from jaxcap.models.qwen3vl_config import Qwen3VLConfig
from jaxcap.models.qwen3vl_presets import qwen3vl_2b, qwen3vl_4b, qwen3vl_8b, qwen3vl_mid, qwen3vl_tiny
from jaxcap.models.rope_index import qwen3vl_rope_index
