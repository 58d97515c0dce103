"""The synthetic world: procedural scenes and clips with known ground truth, for running RL anywhere.

Names are imported lazily because the rule-based judge (jaxcap.judges) reads this package's language
modules while the dataset writer here uses that judge for curation.
"""

import importlib

_EXPORTS = {
  "Scene": "scene",
  "SceneObject": "scene",
  "WorldConfig": "scene",
  "sample_scene": "scene",
  "generate_dataset": "manifest",
  "judge_for_manifest": "manifest",
  "read_manifest": "manifest",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
  if name not in _EXPORTS:
    raise AttributeError(f"module 'jaxcap.data.synthetic' has no attribute {name!r}")
  return getattr(importlib.import_module(f"jaxcap.data.synthetic.{_EXPORTS[name]}"), name)
