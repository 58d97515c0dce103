"""The main job end to end on a tiny budget: it runs, checkpoints, and a SIGKILLed run resumes to the same
metrics as an uninterrupted run of the same seed."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # launches training runs in subprocesses

ROOT = Path(__file__).resolve().parents[2]
TINY = [
  "--config.sft.steps=4",
  "--config.sft.batch_size=8",
  "--config.rl.steps=6",
  "--config.rl.batch_size=4",
  "--config.rl.num_samples=4",
  "--config.sampling.max_new_tokens=16",
  "--config.sft.max_target_tokens=32",
  "--config.world.train_scenes=32",
  "--config.world.eval_scenes=8",
  "--config.eval.num_images=8",
  "--config.eval.every=0",
  "--config.checkpoint.every=2",
  "--config.model.student.text_layers=1",
  "--config.model.student.vision_depth=1",
  "--config.vision_warmup.steps=2",
  "--config.vision_warmup.batch_size=4",
]


def _launch(workdir, extra=(), **kw):
  env = {**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu"}
  cmd = [
    sys.executable,
    "-m",
    "jaxcap.launch",
    f"--config={ROOT / 'configs' / 'caprl.py'}",
    f"--config.workdir={workdir}",
    *TINY,
    *extra,
  ]
  return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def _metrics(workdir):
  rows = [json.loads(line) for line in (Path(workdir) / "metrics.jsonl").read_text().splitlines()]
  return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("full")
  proc = _launch(workdir)
  out, _ = proc.communicate(timeout=600)
  assert proc.returncode == 0, out[-3000:]
  return workdir


def test_run_writes_everything(uninterrupted):
  w = uninterrupted
  assert (w / "curves.png").stat().st_size > 0
  assert (w / "export" / "model.safetensors").exists() and (w / "export" / "tokenizer.json").exists()
  summary = json.loads((w / "summary.json").read_text())
  assert {"sft_end", "rl_start", "rl_end"} <= set(summary)
  from jaxcap.eval.captioners import read_caption_jsonl  # held-out captions the evaluator reads

  for name in ("sft_end", "rl_end"):
    assert len(read_caption_jsonl(w / "captions" / f"{name}.jsonl").captions) == 8
  rows = _metrics(w)
  assert [r["step"] for r in rows if r["phase"] == "rl" and "loss" in r] == [1, 2, 3, 4, 5, 6]
  assert any((w / "tensorboard").iterdir())


def test_sigkill_then_rerun_resumes_to_identical_metrics(uninterrupted, tmp_path):
  workdir = tmp_path / "killed"
  proc = _launch(workdir)
  ckpts = workdir / "checkpoints"
  deadline = time.time() + 600
  while time.time() < deadline:  # kill once an RL-phase checkpoint (global step > 4) is on disk
    steps = [int(p.name) for p in ckpts.glob("[0-9]*") if p.name.isdigit()] if ckpts.exists() else []
    if any(s >= 6 for s in steps) or proc.poll() is not None:
      break
    time.sleep(0.2)
  assert proc.poll() is None, "the run ended before it could be killed; make it longer"
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  rerun = _launch(workdir)
  out, _ = rerun.communicate(timeout=600)
  assert rerun.returncode == 0, out[-3000:]
  assert "resumed rl" in out
  assert _metrics(workdir) == _metrics(uninterrupted)
