"""Issue 16, case 1, end to end: a run whose judge cannot judge stops with a clear error instead of exiting 0 —
at once when an endpoint is unreachable (preflight, before any training step), and after
`judge.failure_patience` steps when the judge keeps failing mid-run (failure budget)."""

import time

import pytest
from judge_servers import closed_port_url

from processes import cpu_env, launch, tiny_run

pytestmark = pytest.mark.slow  # training runs in subprocesses

# RL only: 4 steps of 4 prompts x 2 samples
TINY = tiny_run(
  {
    "sft.steps": 0,
    "sft.batch_size": None,
    "sft.max_target_tokens": None,
    "rl.steps": 4,
    "rl.batch_size": 4,
    "eval.every": 0,
    "vision_warmup.steps": 0,
    "vision_warmup.batch_size": None,
    "export.hf": None,
  }
)


def _train(workdir, *overrides, JUDGE_API_KEY=None):
  start = time.monotonic()
  env = cpu_env(1, JUDGE_API_KEY=JUDGE_API_KEY)  # the key only where a test sets it
  out = launch("caprl", *TINY, *overrides, workdir=workdir, env=env, timeout=300, check=False)
  return out.returncode, out.stdout + out.stderr, time.monotonic() - start


def test_unreachable_judge_stops_the_run_before_any_step(tmp_path):
  url = closed_port_url()
  code, out, _ = _train(tmp_path, "--config.judge.kind=http", f"--config.judge.endpoints={url}")
  assert code == 1
  [error] = [line for line in out.splitlines() if line.startswith("error: ")]
  assert error.startswith("error: JudgePreflightError: ") and "nothing was run" in error, out[-3000:]
  [check] = [line for line in out.splitlines() if line.startswith(f"  - role 'judge' at {url}: ")]
  assert "JUDGE_API_KEY" in check and "judge.api_key_env" in check  # the variable and the field naming it
  assert "export JUDGE_API_KEY=" in check  # the fix
  code, out, _ = _train(tmp_path, "--config.judge.kind=http", f"--config.judge.endpoints={url}", JUDGE_API_KEY="k")
  assert code == 1 and f"  - role 'judge' at {url}: cannot connect (ConnectError: " in out
  assert not (tmp_path / "metrics.jsonl").exists() or "rl" not in (tmp_path / "metrics.jsonl").read_text()
  assert not list((tmp_path / "checkpoints").glob("[0-9]*"))


def test_a_judge_that_keeps_failing_stops_the_run_with_the_reasons_counted(tmp_path):
  code, out, _ = _train(tmp_path, "--config.judge.failure_rate=1.0", "--config.judge.failure_patience=2")
  assert code == 1, out[-3000:]
  [error] = [line for line in out.splitlines() if line.startswith("error: ")]
  assert error.startswith("error: JudgeFailureBudgetError: "), out[-3000:]
  assert "judge.min_valid_fraction" in error and "2 consecutive RL steps" in error  # the budget and the patience
  assert "(steps 1-2: 0 of " in error  # the steps it was spent on, as metrics.jsonl numbers them
  # the reasons counted: every failure is a refusal (the rule-based judge's injected failures)
  counts = dict(kv.split(" ") for kv in error.split("Failed judgments by kind: ")[1].split(".")[0].split(", "))
  assert all(counts[k] == "0" for k in ("auth", "timeout", "connection", "http_status", "parse")), counts
  assert int(counts["refused"]) > 0, counts
  assert "lower judge.min_valid_fraction" in error and "raise judge.failure_patience" in error  # the fixes
  assert "Event loop is closed" not in out and out.count("Traceback") == 0
  assert not list((tmp_path / "checkpoints").glob("[0-9]*"))  # nothing trained on nothing was saved
