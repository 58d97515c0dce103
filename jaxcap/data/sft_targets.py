"""Where SFT targets come from (`sft.targets`): a registry of builders `build(run_config, scenes) -> target`, with
`target(record, rng) -> caption` called per record and step (rng: numpy Generator seeded per step, so a resumed
run draws the same targets).

`reference` (the manifest's reference captions) is registered here; the synthetic world's `incomplete` and
`complete` captions are registered by `jaxcap.world.student`, which `jaxcap.config_files` imports.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from jaxcap.data.records import ImageRecord
from jaxcap.registry import Registry

SFTTarget = Callable[[ImageRecord, np.random.Generator], str]

SFT_TARGETS: Registry[Callable[[Any, Mapping[str, Any]], SFTTarget]] = Registry(
  "SFT target source", field="sft.targets"
)


@SFT_TARGETS.register("reference")
def reference_targets(config, scenes) -> SFTTarget:
  return lambda rec, rng: rec.reference_caption


def sft_target_fn(config, scenes: Mapping[str, Any]) -> SFTTarget:
  """The target function `config.sft.targets` names."""
  return SFT_TARGETS[config.sft.targets](config, scenes)
