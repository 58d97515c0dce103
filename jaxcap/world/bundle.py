"""Everything the synthetic world ships for one scene: ground truth, media, curated questions, captions."""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxcap.world.captions import reference_caption, reference_units, student_caption, teacher_captions
from jaxcap.world.curation import CurationConfig, curate_questions
from jaxcap.world.questions import generate_questions
from jaxcap.world.scene import Scene, WorldConfig, sample_scene
from jaxcap.judges.protocol import Judge
from jaxcap.data.records import ImageRecord, MultipleChoiceQuestion


@dataclasses.dataclass(frozen=True)
class SceneBundle:
  scene: Scene
  questions: tuple[MultipleChoiceQuestion, ...]  # curated and subsampled
  reference_caption: str
  reference_units: tuple[str, ...]
  teacher_captions: dict[str, str]
  student_caption: str  # the stand-in student the stored rubric was synthesised against

  def record(self, image: str = "", frames: tuple[str, ...] = (), rubric=None) -> ImageRecord:
    return ImageRecord(
      id=self.scene.id,
      image=image,
      frames=frames,
      questions=self.questions,
      rubric=rubric,
      reference_caption=self.reference_caption,
      reference_units=self.reference_units,
      teacher_captions=self.teacher_captions,
    )


def scene_rng(seed: int, index: int) -> np.random.Generator:
  """Independent stream per scene: scene i is the same whatever else is generated."""
  return np.random.default_rng([seed, index])


def build_bundle(
  scene_id: str,
  rng: np.random.Generator,
  judge: Judge,
  config: WorldConfig = WorldConfig(),
  clip: bool = False,
  questions_per_scene: int = 5,
  curation: CurationConfig | None = CurationConfig(),
) -> SceneBundle:
  """Samples a scene and derives its questions (curated with `judge`; `curation=None` keeps every candidate,
  leaky ones included, as CapRL's no-curation ablation), references and committee captions."""
  scene = sample_scene(rng, scene_id, config, clip=clip)
  if hasattr(judge, "add_scene"):
    judge.add_scene(scene)
  reference = reference_caption(scene)
  candidates = generate_questions(scene, rng)
  if curation is None:
    kept = list(candidates)
  else:
    kept = [v.question for v in curate_questions(judge, scene.id, candidates, reference, curation) if v.kept]
  return SceneBundle(
    scene=scene,
    questions=tuple(_diverse(kept, questions_per_scene, rng)),
    reference_caption=reference,
    reference_units=tuple(reference_units(scene)),
    teacher_captions=teacher_captions(scene, rng),
    student_caption=student_caption(scene, rng),
  )


def _diverse(questions: list[MultipleChoiceQuestion], limit: int, rng: np.random.Generator):
  """Up to `limit` questions, round-robin over kinds so one image's questions probe different things."""
  by_kind: dict[str, list[MultipleChoiceQuestion]] = {}
  for i in rng.permutation(len(questions)):
    by_kind.setdefault(questions[int(i)].kind, []).append(questions[int(i)])
  kinds = sorted(by_kind)
  kinds = [kinds[int(i)] for i in rng.permutation(len(kinds))]
  out: list[MultipleChoiceQuestion] = []
  while len(out) < limit and any(by_kind.values()):
    for kind in kinds:
      if by_kind[kind] and len(out) < limit:
        out.append(by_kind[kind].pop())
  return sorted(out, key=lambda q: q.id)
