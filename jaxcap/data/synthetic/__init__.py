"""The synthetic world: procedural scenes and clips with known ground truth, for running RL anywhere.

The package exports the world model; the dataset writer is `jaxcap.data.synthetic.manifest` (it curates
questions with the rule-based judge, which itself reads this package's scenes and language).
"""

from jaxcap.data.synthetic.scene import Scene, SceneObject, WorldConfig, sample_scene

__all__ = ["Scene", "SceneObject", "WorldConfig", "sample_scene"]
