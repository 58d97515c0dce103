"""A 2-process jax.distributed run (CPU, gloo collectives) gives the same losses as a 1-process run with the
same global batch: vision warm-up steps, SFT steps, then RL steps (rollouts sampled across both processes, rewards judged per process,
advantages and the loss over the global batch; a small entropy bonus keeps the RL loss non-zero while the tiny
student's rewards are still flat)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from processes import cpu_env, run_processes

pytestmark = pytest.mark.slow  # launches training runs in subprocesses

ROOT = Path(__file__).resolve().parents[2]
COMMON = [
  "--config.sft.steps=3",
  "--config.rl.steps=2",
  "--config.rl.num_samples=2",
  "--config.sampling.max_new_tokens=8",
  "--config.rl.loss.entropy_coef=0.01",
  "--config.world.train_scenes=16",
  "--config.world.eval_scenes=4",
  "--config.eval.num_images=0",
  "--config.model.student.text_layers=1",
  "--config.model.student.vision_depth=1",
  "--config.sft.max_target_tokens=16",
  "--config.checkpoint.every=2",
  "--config.export.hf=False",
  "--config.vision_warmup.steps=2",
  "--config.vision_warmup.batch_size=4",
]


def _cmd(workdir, *extra):
  return [
    sys.executable,
    "-m",
    "jaxcap.launch",
    f"--config={ROOT / 'configs' / 'caprl.py'}",
    f"--config.workdir={workdir}",
    *COMMON,
    *extra,
  ]


def _losses(workdir):
  rows = [json.loads(line) for line in (Path(workdir) / "metrics.jsonl").read_text().splitlines()]
  return [(r["phase"], r["step"], r["loss"], r["grad_norm"]) for r in rows if "loss" in r]


def test_two_processes_match_one(tmp_path):
  one = subprocess.run(
    _cmd(tmp_path / "one", "--config.sft.batch_size=4", "--config.rl.batch_size=4"),
    env=cpu_env(2),
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert one.returncode == 0, one.stderr[-3000:]
  run_processes(
    lambda i, port: _cmd(
      tmp_path / "two",
      "--config.sft.batch_size=2",
      "--config.rl.batch_size=2",  # per process
      f"--config.distributed.coordinator_address=127.0.0.1:{port}",
      "--config.distributed.num_processes=2",
      f"--config.distributed.process_id={i}",
    ),
    count=2,
    devices=1,
  )
  got, want = _losses(tmp_path / "two"), _losses(tmp_path / "one")
  assert [(p, s) for p, s, *_ in got] == [
    ("vision", 1),
    ("vision", 2),
    ("sft", 1),
    ("sft", 2),
    ("sft", 3),
    ("rl", 1),
    ("rl", 2),
  ]
  assert all(g > 0 for *_, g in got)
  assert [(p, s) for p, s, *_ in want] == [(p, s) for p, s, *_ in got]  # same rows in both runs, in order
  for (_, _, l2, g2), (_, _, l1, g1) in zip(got, want, strict=True):
    assert abs(l2 - l1) <= 1e-5 * abs(l1) and abs(g2 - g1) <= 1e-4 * abs(g1)
