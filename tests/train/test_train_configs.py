"""Every method's config runs the main job end to end on a tiny budget and logs its own rewards."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--config.sft.steps=2", "--config.sft.batch_size=4", "--config.rl.steps=2", "--config.rl.batch_size=2",
        "--config.rl.num_samples=2", "--config.sampling.max_new_tokens=8", "--config.sft.max_target_tokens=16",
        "--config.world.train_scenes=8", "--config.world.eval_scenes=4", "--config.eval.num_images=4",
        "--config.model.student.text_layers=1", "--config.model.student.vision_depth=1", "--config.export.hf=False"]


@pytest.mark.parametrize("config, reward", [("rubicap", "reward/rubicap/pass_rate"),
                                            ("balcaprl", "reward/balcaprl/precision"),
                                            ("caprl_video", "reward/caprl/accuracy")])
def test_config_runs_and_logs_its_rewards(tmp_path, config, reward):
  env = {**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu"}
  out = subprocess.run([sys.executable, "-m", "jaxcap.launch", f"--config={ROOT / 'configs' / f'{config}.py'}",
                        f"--config.workdir={tmp_path}", *TINY], env=env, cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  rl = [r for r in rows if r["phase"] == "rl" and "loss" in r]
  assert len(rl) == 2 and all(reward in r for r in rl)
  if config == "balcaprl":
    assert all(0 <= r["length/in_band"] <= 1 for r in rl)  # the two-sided length mask ran


def test_sft_config_runs_without_rl(tmp_path):
  env = {**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu"}
  args = [a for a in TINY if not a.startswith("--config.rl.")]
  out = subprocess.run([sys.executable, "-m", "jaxcap.launch", f"--config={ROOT / 'configs' / 'sft.py'}",
                        f"--config.workdir={tmp_path}", *args], env=env, cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert {r["phase"] for r in rows} == {"sft"}
  assert [r["step"] for r in rows if "loss" in r] == [1, 2]
  assert "eval/qa_accuracy" in json.loads((tmp_path / "summary.json").read_text())["sft_end"]
