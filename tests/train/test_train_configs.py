"""Every method's config runs the main job end to end on a tiny budget and logs its own rewards."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # launches training runs in subprocesses

ROOT = Path(__file__).resolve().parents[2]
TINY = [
  "--config.sft.steps=2",
  "--config.sft.batch_size=4",
  "--config.rl.steps=2",
  "--config.rl.batch_size=2",
  "--config.rl.num_samples=2",
  "--config.sampling.max_new_tokens=8",
  "--config.sft.max_target_tokens=16",
  "--config.world.train_scenes=8",
  "--config.world.eval_scenes=4",
  "--config.eval.num_images=4",
  "--config.model.student.text_layers=1",
  "--config.model.student.vision_depth=1",
  "--config.export.hf=False",
  "--config.vision_warmup.steps=2",
  "--config.vision_warmup.batch_size=4",
]


@pytest.mark.parametrize(
  "config, reward",
  [
    ("rubicap", "reward/rubicap/pass_rate"),
    ("balcaprl", "reward/balcaprl/precision"),
    ("caprl_video", "reward/caprl/accuracy"),
  ],
)
def test_config_runs_and_logs_its_rewards(tmp_path, config, reward):
  env = {**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu"}
  out = subprocess.run(
    [
      sys.executable,
      "-m",
      "jaxcap.launch",
      f"--config={ROOT / 'configs' / f'{config}.py'}",
      f"--config.workdir={tmp_path}",
      *TINY,
    ],
    env=env,
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  rl = [r for r in rows if r["phase"] == "rl" and "loss" in r]
  assert len(rl) == 2 and all(reward in r for r in rl)
  if config == "balcaprl":
    assert all(0 <= r["length/in_band"] <= 1 for r in rl)  # the two-sided length mask ran
    end = json.loads((tmp_path / "summary.json").read_text())["rl_end"]
    assert 0 <= end["eval/length_in_band"] <= 1  # ... and held-out evaluation scores the masked reward
    masked = end["eval/balcaprl/linguistic"] <= end["eval/length_in_band"] + 1e-6
    assert masked, end  # linguistic quality is at most 1 inside the band and 0 outside it


def test_sft_config_runs_without_rl(tmp_path):
  env = {**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu"}
  args = [a for a in TINY if not a.startswith("--config.rl.")]
  out = subprocess.run(
    [
      sys.executable,
      "-m",
      "jaxcap.launch",
      f"--config={ROOT / 'configs' / 'sft.py'}",
      f"--config.workdir={tmp_path}",
      *args,
    ],
    env=env,
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert {r["phase"] for r in rows} == {"vision", "sft"}  # the embedded student's ViT warm-up, then SFT
  assert [r["step"] for r in rows if r["phase"] == "sft" and "loss" in r] == [1, 2]
  assert [r["step"] for r in rows if r["phase"] == "vision" and "loss" in r] == [1, 2]
  accuracy = json.loads((tmp_path / "summary.json").read_text())["vision_warmup"]
  assert set(accuracy) == {"vision/colour_acc", "vision/shape_acc", "vision/size_acc"}
  assert all(0 <= v <= 1 for v in accuracy.values())
  assert "eval/qa_accuracy" in json.loads((tmp_path / "summary.json").read_text())["sft_end"]


def test_rubicap_rubrics_are_written_against_the_policy_entering_rl(tmp_path):
  """RubiCap stage 1 runs on the policy's own greedy captions: each held-out rubric's student caption is the
  caption the policy wrote at the start of RL, and that caption fails every criterion of its rubric (they name
  exactly its failures) unless it had none, when the rubric lists the whole consensus and it passes them all."""
  from jaxcap.world.dataset import judge_for_manifest
  from jaxcap.rewards.rubicap import RubiCapReward
  from jaxcap.rewards.rubric import RubricStore

  env = {**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu"}
  cmd = [
    sys.executable,
    "-m",
    "jaxcap.launch",
    f"--config={ROOT / 'configs' / 'rubicap.py'}",
    f"--config.workdir={tmp_path}",
    *TINY,
  ]
  out = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "rubrics: 12 written against the policy's captions" in out.stdout + out.stderr
  start = {r["id"]: r["caption"] for r in map(json.loads, open(tmp_path / "captions" / "rl_start.jsonl"))}
  records, judge = judge_for_manifest(tmp_path / "world" / "heldout" / "manifest.jsonl")
  store = RubricStore(tmp_path / "rubrics")
  rubrics = [store.load(r.id) for r in records]
  assert [r.student_caption for r in rubrics] == [start[r.id] for r in records]
  manifest_rubrics = {r.id: r.rubric for r in records}
  assert any(manifest_rubrics[r.image_id].criteria != r.criteria for r in rubrics)  # not the manifest's
  reward = RubiCapReward(judge, store=store)
  rates = reward([start[r.id] for r in records], [r.__class__(id=r.id) for r in records]).values[:, 0]
  from jaxcap.judges.protocol import CoverageRequest

  coverage = judge.match_reference_units([CoverageRequest(r.image_id, r.student_caption, r.consensus) for r in rubrics])
  assert len(rubrics) == len(rates) == len(coverage) > 0
  for rubric, rate, cov in zip(rubrics, rates, coverage, strict=True):
    only_states = all(c.text.startswith("The caption states: ") for c in rubric.criteria)
    no_failures = all(cov.covered) and only_states
    assert rate == (1.0 if no_failures else 0.0), (rubric, rate)
  # A rerun in the same workdir finds every step done and every rubric stored: nothing is rewritten.
  again = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert again.returncode == 0 and "rubrics:" not in again.stdout + again.stderr
