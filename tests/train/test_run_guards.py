"""Issue 30 end to end, on tiny SFT-only runs: a run at lr=1e3 stops at its first diverged step with its last good
checkpoint intact and no export; a rerun at a sane lr (--config.resume_changes=allow) continues from it; a
checkpoint whose data was truncated is moved aside and the run resumes from the one before; config errors (a flag
of the wrong type, a non-finite number) exit 2."""

import json
import os
from pathlib import Path

import pytest

from processes import SFT_CHECKPOINTS, launch, tiny_run

pytestmark = pytest.mark.slow  # training runs in subprocesses

RUN = tiny_run({**SFT_CHECKPOINTS, "export.hf": True})


def _launch(workdir, *extra):
  return launch("caprl", *RUN, *extra, workdir=workdir, timeout=400, check=False)


def _rows(workdir):
  return [json.loads(line) for line in (Path(workdir) / "metrics.jsonl").read_text().splitlines()]


def _checkpoints(workdir, name="checkpoints"):
  return sorted(p.name for p in (Path(workdir) / name).iterdir())


@pytest.fixture(scope="module")
def diverged(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("diverged")
  return workdir, _launch(workdir, "--config.sft.optim.lr=1000.0")


def test_diverging_run_stops_at_its_first_diverged_step_keeping_the_last_good_checkpoint(diverged):
  workdir, out = diverged
  assert out.returncode == 1, out.stderr[-3000:]
  [error] = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
  # warm-up: step 1 runs at lr 0, step 2 at lr 50, whose update dwarfs the weights
  assert error.startswith("error: NonFiniteError: sft step 2: diverged (update norm above train.max_update_ratio"), (
    error
  )
  assert f"the last good checkpoint is {workdir}/checkpoints/1." in error and "resume_changes=allow" in error
  assert out.stderr.endswith(f"{error}\n(traceback: {workdir}/error.log)\n")
  assert _checkpoints(workdir) == ["1"] and not (workdir / "export").exists()
  rows = [r for r in _rows(workdir) if "loss" in r]
  assert [r["step"] for r in rows] == [1, 2] and "skipped" not in rows[0]
  assert rows[1]["skipped"] == "update (diverged)" and rows[1]["update_norm"] > 1e3


def test_rerun_at_a_sane_lr_continues_from_the_last_good_checkpoint(diverged):
  workdir, _ = diverged
  out = _launch(workdir, "--config.resume_changes=allow")
  assert out.returncode == 0, out.stderr[-3000:]
  assert "resumed sft at step 1" in out.stdout and "sft.optim.lr: 1000.0 -> 0.002" in out.stderr
  assert _checkpoints(workdir) == ["2", "3"] and (workdir / "export" / "model.safetensors").exists()
  rows = [r for r in _rows(workdir) if "loss" in r]
  assert [r["step"] for r in rows] == [1, 2, 3] and not any("skipped" in r for r in rows)
  assert all(isinstance(r["loss"], float) for r in rows)


def test_truncated_latest_checkpoint_is_moved_aside_and_the_run_resumes_from_the_one_before(diverged):
  workdir, _ = diverged
  data = [p for p in (workdir / "checkpoints" / "3" / "state").rglob("*") if p.is_file() and p.parent.name == "d"]
  biggest = max(data, key=lambda p: p.stat().st_size)
  os.truncate(biggest, biggest.stat().st_size // 2)
  out = _launch(workdir, "--config.sft.steps=4")
  assert out.returncode == 0, out.stderr[-3000:]
  [note] = [line for line in out.stderr.splitlines() if line.startswith("note: checkpoint 3 ")]
  assert f"moved it to {workdir}/checkpoints_damaged/3; resuming from checkpoint 2" in note, note
  assert "resumed sft at step 2" in out.stdout and "ConfigChangedError" not in out.stderr
  assert _checkpoints(workdir) == ["3", "4"] and _checkpoints(workdir, "checkpoints_damaged") == ["3"]
  assert "Event loop is closed" not in out.stderr


@pytest.mark.parametrize(
  "flag, error",
  [
    ("--config.rl.steps=abc", "error: --config.rl.steps=abc: "),
    ("--config.rl.optim.lr=inf", "error: invalid config:\n  - rl.optim.lr=inf: must be a finite number"),
  ],
)
def test_config_errors_exit_2(tmp_path, flag, error):
  out = launch("caprl", flag, workdir=tmp_path / "w", timeout=120, check=False)
  assert out.returncode == 2 and out.stderr.startswith(error), out.stderr[-3000:]
  assert "Traceback" not in out.stderr and not (tmp_path / "w").exists()
