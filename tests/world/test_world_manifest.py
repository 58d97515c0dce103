import json
import time

import numpy as np

from jaxcap.world.captions import TEACHER_STYLES, teacher_captions
from jaxcap.world.dataset import generate_dataset, judge_for_manifest
from jaxcap.world.scene import WorldConfig, sample_scene
from jaxcap.rewards.balcaprl import BalCapRLReward
from jaxcap.rewards.caprl import CapRLConfig, CapRLReward
from jaxcap.rewards.rubicap import RubiCapReward


def test_dataset_layout_rows_and_roundtrip(tmp_path):
  manifest = generate_dataset(tmp_path / "d", 12, seed=1, config=WorldConfig(image_size=64, clip_fraction=0.5))
  rows = [json.loads(line) for line in manifest.read_text().splitlines()]
  assert len(rows) == 12
  for row in rows:
    for field in ("id", "image", "questions", "rubric", "reference_caption", "scene", "media_type"):
      assert row[field], field
    assert (tmp_path / "d" / row["image"]).exists()
    assert (tmp_path / "d" / "rubrics" / f"{row['id']}.json").exists()
    assert len(row["questions"]) == 5 and len(row["teacher_captions"]) == 5
    if row["media_type"] == "video":
      assert len(row["frames"]) == row["scene"]["num_frames"] > 1
  assert {r["media_type"] for r in rows} == {"image", "video"}
  records, judge = judge_for_manifest(manifest)
  assert [r.id for r in records] == [r["id"] for r in rows] and set(judge.scenes) == {r["id"] for r in rows}


def test_generation_is_seeded_and_prefix_stable(tmp_path):
  a = generate_dataset(tmp_path / "a", 6, seed=3, config=WorldConfig(image_size=64)).read_text()
  b = generate_dataset(tmp_path / "b", 6, seed=3, config=WorldConfig(image_size=64)).read_text()
  c = generate_dataset(tmp_path / "c", 3, seed=3, config=WorldConfig(image_size=64)).read_text()
  d = generate_dataset(tmp_path / "e", 6, seed=4, config=WorldConfig(image_size=64)).read_text()
  assert a == b and a.startswith(c.replace("/c/", "/a/")) and a != d
  assert (tmp_path / "a/images/scene000000.png").read_bytes() == (tmp_path / "b/images/scene000000.png").read_bytes()


def test_generation_is_fast(tmp_path):
  start = time.perf_counter()
  generate_dataset(tmp_path / "d", 100, seed=0, config=WorldConfig(image_size=64, clip_fraction=0.2))
  assert time.perf_counter() - start < 15  # well over a thousand scenes per minute on 2 cores


def test_teachers_have_distinct_styles_and_error_profiles(tmp_path):
  manifest = generate_dataset(tmp_path / "d", 30, seed=2, config=WorldConfig(image_size=64))
  records, judge = judge_for_manifest(manifest)
  captions = [r.teacher_captions[style] for r in records for style in TEACHER_STYLES]
  per_caption = [r for r in records for _ in TEACHER_STYLES]
  values = BalCapRLReward(judge)(captions, per_caption).values.reshape(len(records), len(TEACHER_STYLES), 3)
  mean = dict(zip(TEACHER_STYLES, values.mean(axis=0)))
  prec, rec = {k: v[0] for k, v in mean.items()}, {k: v[1] for k, v in mean.items()}
  assert rec["meticulous"] > rec["hallucinating"] > rec["terse"]
  assert prec["meticulous"] > prec["hallucinating"] and prec["meticulous"] > prec["spatially_confused"]
  assert prec["poetic"] < prec["meticulous"]  # meta-commentary is not pointable
  assert mean["terse"][1] < mean["poetic"][1]
  # Honest dense captions > weak teacher > empty, for CapRL and RubiCap on every image of the dataset.
  for fn in (CapRLReward(judge, CapRLConfig(questions_per_caption=5)), RubiCapReward(judge)):
    honest = fn([r.reference_caption for r in records], records).values[:, 0]
    weak = fn([r.teacher_captions["terse"] for r in records], records).values[:, 0]
    empty = fn([""] * len(records), records).values[:, 0]
    assert honest.mean() > weak.mean() > empty.mean()
    assert (honest >= weak).all() and (weak >= empty).all()


def test_teacher_captions_are_seeded():
  scene = sample_scene(np.random.default_rng(0), "s")
  assert teacher_captions(scene, np.random.default_rng(1)) == teacher_captions(scene, np.random.default_rng(1))
