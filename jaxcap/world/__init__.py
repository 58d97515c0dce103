"""The embedded world: procedural scenes and clips with known ground truth, for running RL anywhere.

Scenes (`scene`, `vocabulary`), their rendering (`render`), questions and captions (`questions`, `captions`,
`language`), QA curation (`curation`), records and the dataset writer (`bundle`, `dataset`), the tokenizer trained
on its text (`tokenizer`), its rule-based oracle judge (`judge`, `language_rating`, `judge_server`), the embedded
student and its SFT targets (`student`) and the vision warm-up (`vision_warmup`).

Importing the package registers what configs choose by name: judge.kind='rule_based' and the world's
sft.targets ('incomplete', 'complete').
"""

from jaxcap.world import judge as _judge  # noqa: F401  (registers judge.kind='rule_based')
from jaxcap.world import student as _student  # noqa: F401  (registers sft.targets 'incomplete', 'complete')
from jaxcap.world.scene import Scene, SceneObject, WorldConfig, as_scenes, sample_scene

__all__ = ["Scene", "SceneObject", "WorldConfig", "as_scenes", "sample_scene"]
