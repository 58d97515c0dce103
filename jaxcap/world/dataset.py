"""Writes a synthetic dataset directory that the training data pipeline reads like any user's dataset.

Layout:  <out>/images/<id>.png            still images
         <out>/frames/<id>/frame_<t>.png  clip frames (the first frame doubles as `image`)
         <out>/rubrics/<id>.json          rubrics (RubricStore), re-synthesisable
         <out>/manifest.jsonl             one row per scene: id, image, frames, media_type, questions, rubric,
                                          reference_caption, reference_units, teacher_captions, scene (ground truth)
Paths in the manifest are relative to <out>.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Sequence

from jaxcap.world.curation import CurationConfig
from jaxcap.world.render import render_clip, render_frame
from jaxcap.world.scene import Scene, WorldConfig
from jaxcap.world.bundle import build_bundle, scene_rng
from jaxcap.world.judge import RuleBasedJudge
from jaxcap.data.manifest import read_manifest
from jaxcap.data.records import ImageRecord
from jaxcap.rewards.rubric import RubricJob, RubricStore, RubricSynthesisConfig

MANIFEST_NAME = "manifest.jsonl"


def generate_dataset(
  out_dir: str | os.PathLike,
  num_scenes: int,
  *,
  seed: int = 0,
  config: WorldConfig = WorldConfig(),
  questions_per_scene: int = 5,
  curation: CurationConfig | None = CurationConfig(),
  with_rubrics: bool = True,
  id_prefix: str = "scene",
) -> pathlib.Path:
  """Generates `num_scenes` scenes (a `config.clip_fraction` share are clips); returns the manifest path.

  Deterministic in (seed, config, num_scenes): scene i uses its own random stream, so the first k scenes
  of a bigger dataset equal a dataset of k scenes.
  """
  if num_scenes < 1:
    raise ValueError(f"num_scenes={num_scenes}: generate at least one scene.")
  out = pathlib.Path(out_dir)
  (out / "images").mkdir(parents=True, exist_ok=True)
  judge = RuleBasedJudge()
  bundles, media = [], []
  for i in range(num_scenes):
    rng = scene_rng(seed, i)
    clip = bool(rng.random() < config.clip_fraction)
    bundle = build_bundle(f"{id_prefix}{i:06d}", rng, judge, config, clip, questions_per_scene, curation)
    bundles.append(bundle)
    media.append(_write_media(out, bundle.scene, config.image_size))
  rubrics = {}
  if with_rubrics:
    store = RubricStore(out / "rubrics")
    jobs = [RubricJob(b.scene.id, tuple(b.teacher_captions.values()), b.student_caption) for b in bundles]
    for outcome in store.synthesize(judge, jobs, overwrite=True, config=RubricSynthesisConfig()):
      rubrics[outcome.image_id] = outcome.rubric
  manifest = out / MANIFEST_NAME
  with open(manifest, "w") as f:
    for bundle, (image, frames) in zip(bundles, media):
      row = bundle.record(image, frames, rubrics.get(bundle.scene.id)).to_json()
      row["media_type"] = "video" if bundle.scene.is_clip else "image"
      row["scene"] = bundle.scene.to_graph()
      f.write(json.dumps(row) + "\n")
  return manifest


def _write_media(out: pathlib.Path, scene: Scene, image_size: int) -> tuple[str, tuple[str, ...]]:
  if not scene.is_clip:
    rel = f"images/{scene.id}.png"
    render_frame(scene, 0, image_size).save(out / rel)
    return rel, ()
  (out / "frames" / scene.id).mkdir(parents=True, exist_ok=True)
  frames = []
  for t, image in enumerate(render_clip(scene, image_size)):
    rel = f"frames/{scene.id}/frame_{t:02d}.png"
    image.save(out / rel)
    frames.append(rel)
  return frames[0], tuple(frames)


def judge_for_manifest(path: str | os.PathLike, **judge_options) -> tuple[list[ImageRecord], RuleBasedJudge]:
  """Records plus a rule-based judge that knows every scene of the manifest."""
  records, scenes = read_manifest(path, require_media=False)
  return records, RuleBasedJudge(scenes, **judge_options)


def scene_ids(records: Sequence[ImageRecord]) -> list[str]:
  return [r.id for r in records]
