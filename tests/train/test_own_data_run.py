"""A run a researcher starts from their own data and reward: a released preset on a local HF checkpoint, a plain
manifest of images (no questions, no scenes), a Python reward function and CapRL++'s length reward, no judge."""

import json

import numpy as np
import pytest

from processes import launch, tiny_run

pytestmark = pytest.mark.slow  # launches training runs in subprocesses


@pytest.fixture(scope="module")
def base(tmp_path_factory):
  """An HF checkpoint (the tiny embedded student after SFT) and its synthetic world's images."""
  workdir = tmp_path_factory.mktemp("base")
  launch("caprl", *tiny_run({"export.hf": True, "rl.steps": 0, "vision_warmup.steps": 0}), workdir=workdir)
  return workdir


def test_released_preset_on_a_plain_manifest_with_a_python_reward_and_no_judge(base, tmp_path):
  images = sorted((base / "world" / "train" / "images").glob("*.png"))[:4]
  manifest = tmp_path / "plain.jsonl"
  manifest.write_text("".join(json.dumps({"id": p.stem, "image": str(p)}) + "\n" for p in images))
  (tmp_path / "my_reward.py").write_text(
    "def score(captions, records):\n  return [min(len(set(c.split())) / 8, 1.0) if c.strip() else None for c in captions]\n"
  )
  reward = {
    "fn": {"function": f"{tmp_path / 'my_reward.py'}:score"},
    "caption_length": {"weight": 0.2, "full_until": 4, "zero_at": 9},
  }
  workdir = tmp_path / "run"
  launch(
    "caprl:released_plus",
    f"--config.model.checkpoint={base / 'export'}",
    f"--config.data.train_manifest={manifest}",
    f"--config.data.media_root={base}",  # the images' folder: outside the manifest's
    "--config.eval.num_images=0",
    "--config.judge.kind=none",
    f"--config.reward={json.dumps(reward)}",
    "--config.rl.steps=2",
    "--config.rl.batch_size=2",
    "--config.rl.num_samples=2",
    "--config.rl.micro_batches=1",
    "--config.sampling.max_new_tokens=8",
    "--config.logging.curves=False",
    workdir=workdir,
  )
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  rl = [r for r in rows if r.get("phase") == "rl"]
  assert [r["step"] for r in rl] == [1, 2]
  for r in rl:  # both rewards scored every caption; the mix is their weighted sum
    assert 0 <= r["reward/fn/score"] <= 1 and 0 <= r["reward/caption_length/score"] <= 1
    np.testing.assert_allclose(
      r["reward/mean"], r["reward/fn/score"] + 0.2 * r["reward/caption_length/score"], rtol=1e-5
    )
  config = json.loads((workdir / "config.json").read_text())["config"]
  assert config["rl"]["recompute_old_logprobs"] is False and config["judge"]["kind"] == "none"
