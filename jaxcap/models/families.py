"""Model-family registry: which student family a config or checkpoint directory belongs to.

One place maps a family name (`model.family`) and a config.json `model_type` to the family's config class, Flax
module, presets and position-id function. Qwen3-VL (issue 33) has its module, presets and HF import / export;
its processor (timestamps, video) and the trainer / sampler wiring are still to come.
"""

import dataclasses
import json
import pathlib
from typing import Any

from jaxcap.models import config as qwen25vl_config
from jaxcap.models import qwen3vl_config
from jaxcap.models.config import Qwen25VLConfig
from jaxcap.models.qwen25vl import Qwen25VL
from jaxcap.models.qwen3vl import Qwen3VL
from jaxcap.models.qwen3vl_config import Qwen3VLConfig
from jaxcap.models.rope_index import qwen3vl_rope_index, rope_index


@dataclasses.dataclass(frozen=True)
class Family:
  """A student family: its `model.family` name, its config.json model_type, config class, Flax module class,
  presets (name -> config builder), 3D position ids (`rope_index(cfg, input_ids, attention_mask, image_grid_thw,
  video_grid_thw, ...)`) and the HF key layout its export writes: `nested_keys` (`model.language_model.*`,
  `model.visual.*`, the only one transformers reads for Qwen3-VL) or the older `model.*`, `visual.*`."""

  name: str
  model_type: str
  config_cls: Any
  model_cls: Any = None
  presets: dict = dataclasses.field(default_factory=dict)
  rope_index: Any = None
  nested_keys: bool = False


FAMILIES: dict[str, Family] = {
  "qwen2_5_vl": Family(
    name="qwen2_5_vl",
    model_type="qwen2_5_vl",
    config_cls=Qwen25VLConfig,
    model_cls=Qwen25VL,
    presets=qwen25vl_config.PRESETS,
    rope_index=rope_index,
  ),
  "qwen3_vl": Family(
    name="qwen3_vl",
    model_type="qwen3_vl",
    config_cls=Qwen3VLConfig,
    model_cls=Qwen3VL,
    presets=qwen3vl_config.PRESETS,
    rope_index=qwen3vl_rope_index,
    nested_keys=True,
  ),
}
DEFAULT_FAMILY = "qwen2_5_vl"


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


def family_of_checkpoint(ckpt_dir: str | pathlib.Path) -> Family:
  """The family of an HF checkpoint directory, read from its config.json `model_type`."""
  path = pathlib.Path(ckpt_dir) / "config.json"
  if not path.is_file():
    raise FileNotFoundError(f"{path} not found: point to an HF checkpoint directory with a config.json.")
  return family_of_model_type(json.loads(path.read_text()).get("model_type"))
