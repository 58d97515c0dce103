"""Model-family registry: which student family a config or checkpoint directory belongs to.

One place maps a family name (`model.family`) and a config.json `model_type` to the family's
config class. Only Qwen2.5-VL is registered today; Qwen3-VL (issue 33) registers here when its
Flax module, HF import / export and processor exist.
"""

import dataclasses
import json
import pathlib
from typing import Any

from jaxcap.models.config import Qwen25VLConfig


@dataclasses.dataclass(frozen=True)
class Family:
  """A student family: its `model.family` name, its config.json model_type and config class."""

  name: str
  model_type: str
  config_cls: Any


FAMILIES: dict[str, Family] = {
  "qwen2_5_vl": Family(name="qwen2_5_vl", model_type="qwen2_5_vl", config_cls=Qwen25VLConfig),
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


def family_of_checkpoint(ckpt_dir: str | pathlib.Path) -> Family:
  """The family of an HF checkpoint directory, read from its config.json `model_type`."""
  path = pathlib.Path(ckpt_dir) / "config.json"
  if not path.is_file():
    raise FileNotFoundError(f"{path} not found: point to an HF checkpoint directory with a config.json.")
  return family_of_model_type(json.loads(path.read_text()).get("model_type"))
