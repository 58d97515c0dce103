"""Model-family registry: which student family a config or checkpoint directory belongs to.

One place maps a family name (`model.family`) and a config.json `model_type` to the family's config class, Flax
module, presets, position-id function and vision layout.
"""

import dataclasses
import json
import pathlib
from typing import Any

from jaxcap.models import config as qwen25vl_config
from jaxcap.models import qwen25vl_presets
from jaxcap.models import qwen35_presets, qwen3vl_presets
from jaxcap.models.config import Qwen25VLConfig
from jaxcap.models.qwen25vl import Qwen25VL
from jaxcap.models.qwen35 import Qwen35
from jaxcap.models.qwen35_config import Qwen35Config
from jaxcap.models.qwen3vl import Qwen3VL
from jaxcap.models.qwen3vl_config import Qwen3VisionConfig, Qwen3VLConfig
from jaxcap.models.qwen3vl_vision import qwen3_layout_shape, qwen3_vision_layout
from jaxcap.models.rope_index import qwen3vl_rope_index, rope_index
from jaxcap.models.vision_layout import LayoutShape, layout_shape, vision_layout


@dataclasses.dataclass(frozen=True)
class Family:
  """A student family: its `model.family` name, its config.json model_type, config class, Flax module class,
  presets (name -> config builder), 3D position ids (`rope_index(cfg, input_ids, attention_mask, image_grid_thw,
  video_grid_thw, ...)`), its vision tower's config class and host-side layout (`vision_layout(grid_thw, vision_cfg,
  shape)`, `layout_shape(grid_thw, vision_cfg)`: what `layout_for` / `layout_shape_for` call) and the HF key layout its export writes: `nested_keys` (`model.language_model.*`, `model.visual.*`,
  the only one transformers reads for Qwen3-VL) or the older `model.*`, `visual.*`. `preprocess`: the image
  processor's defaults that differ from Qwen2.5-VL's (a checkpoint's own preprocessor config still wins).
  `like_qwen25(cfg)`: this family's config of a Qwen2.5-VL config's sizes (how the embedded student is built).
  `processor`: the transformers processor whose rules `jaxcap.processing` follows for this family (a key of
  `jaxcap.processing.rules.PROCESSOR_RULES`: video sampling, resizing and placeholders); `default_system`: the
  system turn the family's chat template adds when a conversation has none (None: no system turn).
  `packs_shared_prompts`: whether packed training rows may lay a prompt out once for its G completions (each
  completion segment also reading its prompt's, `segment_parents`); Qwen3.5's linear layers would need the prompt's
  final state there, so its packed rows repeat the prompt per completion (its padded passes still share it)."""

  name: str
  model_type: str
  config_cls: Any
  model_cls: Any = None
  presets: dict = dataclasses.field(default_factory=dict)
  rope_index: Any = None
  vision_config_cls: Any = None
  vision_layout: Any = None
  layout_shape: Any = None
  preprocess: dict = dataclasses.field(default_factory=dict)
  like_qwen25: Any = None
  nested_keys: bool = False
  processor: str = "qwen2_vl"
  default_system: str | None = "You are a helpful assistant."
  packs_shared_prompts: bool = True


FAMILIES: dict[str, Family] = {
  "qwen2_5_vl": Family(
    name="qwen2_5_vl",
    model_type="qwen2_5_vl",
    config_cls=Qwen25VLConfig,
    model_cls=Qwen25VL,
    presets=qwen25vl_presets.PRESETS,
    rope_index=rope_index,
    vision_config_cls=qwen25vl_config.VisionConfig,
    vision_layout=vision_layout,
    layout_shape=layout_shape,
    like_qwen25=lambda cfg: cfg,
  ),
  "qwen3_vl": Family(
    name="qwen3_vl",
    model_type="qwen3_vl",
    config_cls=Qwen3VLConfig,
    model_cls=Qwen3VL,
    presets=qwen3vl_presets.PRESETS,
    rope_index=qwen3vl_rope_index,
    vision_config_cls=Qwen3VisionConfig,
    vision_layout=qwen3_vision_layout,
    layout_shape=lambda grid_thw, cfg: qwen3_layout_shape(grid_thw),
    preprocess={"image_mean": (0.5, 0.5, 0.5), "image_std": (0.5, 0.5, 0.5)},
    like_qwen25=qwen3vl_presets.qwen3vl_like,
    nested_keys=True,
    processor="qwen3_vl",
    default_system=None,  # Qwen3-VL's template adds no system turn of its own
  ),
  "qwen3_5": Family(
    name="qwen3_5",
    model_type="qwen3_5",
    config_cls=Qwen35Config,
    model_cls=Qwen35,
    presets=qwen35_presets.PRESETS,
    rope_index=qwen3vl_rope_index,
    vision_config_cls=None,  # Qwen3-VL's tower: `family_of_vision` answers qwen3_vl, whose layout it is
    vision_layout=qwen3_vision_layout,
    layout_shape=lambda grid_thw, cfg: qwen3_layout_shape(grid_thw),
    preprocess={"image_mean": (0.5, 0.5, 0.5), "image_std": (0.5, 0.5, 0.5)},
    like_qwen25=qwen35_presets.qwen35_like,
    nested_keys=True,
    processor="qwen3_vl",
    default_system=None,
    packs_shared_prompts=False,
  ),
}
DEFAULT_FAMILY = "qwen2_5_vl"


def preset_names() -> list[str]:
  """Every preset name of every family (tiny / mid exist in each: `preset_config` picks by family)."""
  return list(dict.fromkeys(n for f in FAMILIES.values() for n in f.presets))


def preset_config(name: str, family_name: str = DEFAULT_FAMILY, **overrides):
  """The preset `name`: a family's own (qwen2.5-vl-7b, qwen3-vl-4b, ...), or tiny / mid of `family_name`."""
  for f in (family(family_name), *FAMILIES.values()):
    if name in f.presets:
      return f.presets[name](**overrides)
  raise KeyError(f"{name!r} is no preset; presets: {', '.join(preset_names())}")


def family(name: str) -> Family:
  """The registered family called `name`; a clear error listing the registered ones otherwise."""
  if name not in FAMILIES:
    raise ValueError(f"model.family={name!r} is not a registered family; supported: {sorted(FAMILIES)}.")
  return FAMILIES[name]


def family_of_model_type(model_type: str | None) -> Family:
  """The family whose checkpoints carry config.json `model_type` (None: an old file, the default)."""
  if model_type is None:
    return FAMILIES[DEFAULT_FAMILY]
  for f in FAMILIES.values():
    if f.model_type == model_type:
      return f
  supported = sorted(f.model_type for f in FAMILIES.values())
  raise ValueError(f"config.json has model_type={model_type!r}; jaxcap loads model_type in {supported}.")


def family_of_config(cfg) -> Family:
  """The family whose config class is exactly `type(cfg)` (Qwen3VLConfig extends Qwen25VLConfig)."""
  for f in FAMILIES.values():
    if type(cfg) is f.config_cls:
      return f
  raise ValueError(f"{type(cfg).__name__} is no registered family's config; supported: {sorted(FAMILIES)}.")


def family_of_vision(vision_cfg) -> Family:
  """The family whose vision config class is exactly `type(vision_cfg)`."""
  for f in FAMILIES.values():
    if type(vision_cfg) is f.vision_config_cls:
      return f
  raise ValueError(
    f"{type(vision_cfg).__name__} is no registered family's vision config; supported: {sorted(FAMILIES)}."
  )


def layout_for(grid_thw, vision_cfg, shape: LayoutShape | None = None):
  """The host-side layout of `grid_thw` for the vision tower of `vision_cfg`'s family, padded to `shape` if given
  (`jaxcap.models.vision_layout.vision_layout` for Qwen2.5-VL, `qwen3vl_vision.qwen3_vision_layout`)."""
  return family_of_vision(vision_cfg).vision_layout(grid_thw, vision_cfg, shape)


def layout_shape_for(grid_thw, vision_cfg) -> LayoutShape:
  """The exact (unpadded) shape `layout_for(grid_thw, vision_cfg)` needs."""
  return family_of_vision(vision_cfg).layout_shape(grid_thw, vision_cfg)


def family_of_checkpoint(ckpt_dir: str | pathlib.Path) -> Family:
  """The family of an HF checkpoint directory, read from its config.json `model_type`."""
  path = pathlib.Path(ckpt_dir) / "config.json"
  if not path.is_file():
    raise FileNotFoundError(f"{path} not found: point to an HF checkpoint directory with a config.json.")
  return family_of_model_type(json.loads(path.read_text()).get("model_type"))
