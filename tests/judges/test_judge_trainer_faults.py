"""Issue 16, case 1, end to end: a run whose judge cannot judge stops with a clear error instead of exiting 0 —
at once when an endpoint is unreachable (preflight, before any training step), and after
`judge.failure_patience` steps when the judge keeps failing mid-run (failure budget)."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from judge_servers import closed_port_url

pytestmark = pytest.mark.slow  # training runs in subprocesses

ROOT = Path(__file__).resolve().parents[2]
TINY = [
  "--config.sft.steps=0",
  "--config.rl.steps=4",
  "--config.rl.batch_size=4",
  "--config.rl.num_samples=2",
  "--config.sampling.max_new_tokens=8",
  "--config.world.train_scenes=8",
  "--config.world.eval_scenes=4",
  "--config.eval.num_images=4",
  "--config.eval.every=0",
  "--config.model.student.text_layers=1",
  "--config.model.student.vision_depth=1",
  "--config.vision_warmup.steps=0",
]


def _train(workdir, *overrides, **env):
  full = {**{k: v for k, v in os.environ.items() if k != "JUDGE_API_KEY"}, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu"}
  cmd = [sys.executable, "-m", "jaxcap.launch", f"--config={ROOT / 'configs' / 'caprl.py'}"]
  cmd += [f"--config.workdir={workdir}", *TINY, *overrides]
  start = time.monotonic()
  out = subprocess.run(cmd, env={**full, **env}, cwd=ROOT, capture_output=True, text=True, timeout=300)
  return out.returncode, out.stdout + out.stderr, time.monotonic() - start


def test_unreachable_judge_stops_the_run_before_any_step(tmp_path):
  url = closed_port_url()
  code, out, _ = _train(tmp_path, "--config.judge.kind=http", f"--config.judge.endpoints={url}")
  assert code == 1
  assert (
    "error: JudgePreflightError: Judge preflight failed for 1 endpoint check(s); nothing was run:\n"
    f"  - role 'judge' at {url}: the API key variable JUDGE_API_KEY (judge.api_key_env) is not set, so no "
    "request was sent. Fix: export JUDGE_API_KEY=" in out
  )
  code, out, _ = _train(tmp_path, "--config.judge.kind=http", f"--config.judge.endpoints={url}", JUDGE_API_KEY="k")
  assert code == 1 and f"  - role 'judge' at {url}: cannot connect (ConnectError: " in out
  assert not (tmp_path / "metrics.jsonl").exists() or "rl" not in (tmp_path / "metrics.jsonl").read_text()
  assert not list((tmp_path / "checkpoints").glob("[0-9]*"))


def test_a_judge_that_keeps_failing_stops_the_run_with_the_reasons_counted(tmp_path):
  code, out, _ = _train(tmp_path, "--config.judge.failure_rate=1.0", "--config.judge.failure_patience=2")
  assert code == 1, out[-3000:]
  assert (
    "error: JudgeFailureBudgetError: Judge failure budget spent: valid judgments stayed below "
    "judge.min_valid_fraction=0.5 for 2 consecutive RL steps (steps 0-1: 0 of " in out
  )
  assert "Failed judgments by kind: auth 0, timeout 0, connection 0, http_status 0, parse 0, refused " in out
  assert "Event loop is closed" not in out and out.count("Traceback") == 0
  assert not list((tmp_path / "checkpoints").glob("[0-9]*"))  # nothing trained on nothing was saved
