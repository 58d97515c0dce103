"""Damaged checkpoints (issue 30, case 2): a checkpoint that cannot be read is told apart from a config change,
named in words, moved aside (never deleted), and the run opens at the newest intact one; a real change of the
state's structure is still a ConfigChangedError. In process, on a toy train state (no model, no training)."""

import json
import os
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from jaxcap.train.shell import integrity
from jaxcap.train.shell.checkpointing import RunCheckpointer
from jaxcap.train.shell.integrity import CheckpointDamagedError
from jaxcap.config.training import Optim
from jaxcap.train.steps.state import init_train_state, make_optimizer
from processes import load_config


def _state(frozen=False):
  params = {"visual": {"w": jax.random.normal(jax.random.key(1), (64, 64))}, "lm": {"w": jnp.ones((8,))}}
  opt = make_optimizer(Optim(1e-3), 10, frozen=("visual",) if frozen else ())
  return init_train_state(params, opt, jax.random.key(0))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  """A workdir with checkpoints 1 and 2 of the toy state (SFT steps 1 and 2)."""
  workdir = tmp_path_factory.mktemp("saved")
  ck = RunCheckpointer(workdir / "checkpoints")
  for step in (1, 2):
    ck.save(step, _state(), {"phase": "sft", "step": step, "loader": {"next_index": step}, "summary": {}})
  ck.wait()
  ck.close()
  return workdir


@pytest.fixture
def workdir(saved, tmp_path):
  shutil.copytree(saved, tmp_path / "w")
  return tmp_path / "w"


def _damage(step_dir: Path, how: str) -> None:
  if how == "truncated data":
    data = [p for p in (step_dir / "state").rglob("*") if p.is_file() and p.parent.name == "d"]
    biggest = max(data, key=lambda p: p.stat().st_size)
    os.truncate(biggest, biggest.stat().st_size // 2)
  elif how.startswith("no "):
    (step_dir / how[3:]).unlink()
  elif how == "empty meta":
    (step_dir / "meta" / "metadata").write_text("")
  elif how == "bad meta":
    (step_dir / "meta" / "metadata").write_text('{"phase": "sft", "st')


@pytest.mark.parametrize(
  "how, problem",
  [
    ("no state/_METADATA", "state/_METADATA (the train state's tree metadata) is missing"),
    ("no state/manifest.ocdbt", "state/manifest.ocdbt (the train state's array index) is missing"),
    ("no _CHECKPOINT_METADATA", "_CHECKPOINT_METADATA (the checkpoint's own metadata) is missing"),
    ("empty meta", "meta/metadata (the run position (phase, step, data loader)) is empty"),
    ("bad meta", "meta/metadata (the run position (phase, step, data loader)) is not valid JSON"),
  ],
)
def test_unreadable_files_are_named(workdir, how, problem):
  assert integrity.problems(workdir / "checkpoints" / "1") == []
  _damage(workdir / "checkpoints" / "2", how)
  [found] = integrity.problems(workdir / "checkpoints" / "2")
  assert found.startswith(problem), found


def test_saved_tree_fits_the_same_state_and_not_a_changed_one(saved):
  assert integrity.fits(saved / "checkpoints" / "2", _state())
  assert not integrity.fits(saved / "checkpoints" / "2", _state(frozen=True))  # the optimizer state's tree changed


def _rundir(workdir):
  from jaxcap.train.shell.rundir import RunDirectory

  return RunDirectory(load_config("caprl", workdir=str(workdir), **{"sft.steps": 4, "rl.steps": 0}))


@pytest.mark.parametrize("how", ["empty meta", "no state/manifest.ocdbt", "no state/_METADATA"])
def test_unreadable_latest_checkpoint_is_moved_aside_and_the_run_opens_at_the_one_before(workdir, how, capfd):
  _damage(workdir / "checkpoints" / "2", how)
  run = _rundir(workdir)
  try:
    assert run.latest_step() == 1 and run.meta(1)["step"] == 1
    restored, meta = run.restore(1, _state(), "sft")
    assert meta["loader"] == {"next_index": 1}
  finally:
    run.abort()
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["1"]
  assert sorted(p.name for p in (workdir / "checkpoints_damaged").iterdir()) == ["2"]  # moved, not deleted
  assert (workdir / "checkpoints_damaged" / "2" / "state").is_dir()
  err = capfd.readouterr().err
  note = next(line for line in err.splitlines() if line.startswith("note: checkpoint 2 "))
  assert f"in {workdir}/checkpoints cannot be read (" in note and f"moved it to {workdir}/checkpoints_damaged/2" in note
  assert note.endswith("; resuming from checkpoint 1")
  assert "Event loop is closed" not in err and "JSONDecodeError" not in err


def test_truncated_data_is_damage_at_the_restore_and_the_run_falls_back(workdir, capfd):
  from jaxcap.train.shell.resume import ConfigChangedError

  _damage(workdir / "checkpoints" / "2", "truncated data")
  run = _rundir(workdir)
  try:
    assert run.latest_step() == 2  # its files look whole: only reading the arrays finds the damage
    with pytest.raises(ConfigChangedError):  # a state of another structure is still a config change
      run.restore(2, _state(frozen=True), "sft")
    with pytest.raises(CheckpointDamagedError) as e:
      run.restore(2, _state(), "sft")
    assert e.value.step == 2 and str(e.value).startswith(f"checkpoint 2 in {workdir}/checkpoints cannot be read: ")
    run.set_aside(e.value)
    assert run.latest_step() == 1
    run.restore(1, _state(), "sft")
  finally:
    run.abort()
  assert (workdir / "checkpoints_damaged" / "2").is_dir()
  assert "note: checkpoint 2 " in capfd.readouterr().err


def test_a_second_damaged_copy_of_a_step_is_kept_beside_the_first(workdir):
  first = integrity.set_aside(workdir / "checkpoints" / "2", workdir)
  shutil.copytree(workdir / "checkpoints" / "1", workdir / "checkpoints" / "2")
  second = integrity.set_aside(workdir / "checkpoints" / "2", workdir)
  assert (first.name, second.name) == ("2", "2-1") and first.is_dir() and second.is_dir()
  assert json.loads((second / "meta" / "metadata").read_text())["step"] == 1


def test_abandoned_reads_of_a_failed_restore_are_silenced_and_nothing_else(monkeypatch):
  import sys
  import types

  seen = []
  monkeypatch.setattr(sys, "unraisablehook", lambda report: seen.append(str(report.exc_value)))
  monkeypatch.setattr(integrity, "_quiet", False)
  integrity.quiet_abandoned_reads()
  report = lambda exc, obj: types.SimpleNamespace(
    exc_type=type(exc), exc_value=exc, exc_traceback=None, err_msg=None, object=obj
  )
  sys.unraisablehook(report(RuntimeError("Event loop is closed"), "a tensorstore callback"))
  sys.unraisablehook(report(ValueError("x"), "<coroutine object _read_array_index_and_device_put at 0x1>"))
  sys.unraisablehook(report(ValueError("something else"), "another object"))
  assert seen == ["something else"]


def test_read_error_drops_the_tensorstore_spec():
  error = Exception("Encountered error while reading array index: (slice(0, 1, 1),). See full TensorStore details: <")
  assert integrity.read_error(error) == "Exception: Encountered error while reading array index: (slice(0, 1, 1),)"


def test_every_unreadable_checkpoint_is_moved_and_with_none_left_the_run_starts_over(workdir, capfd):
  _damage(workdir / "checkpoints" / "2", "empty meta")
  _damage(workdir / "checkpoints" / "1", "no state/_METADATA")
  run = _rundir(workdir)
  try:
    assert run.latest_step() is None and run.position() is None
  finally:
    run.abort()
  assert sorted(p.name for p in (workdir / "checkpoints_damaged").iterdir()) == ["1", "2"]
  notes = [line for line in capfd.readouterr().err.splitlines() if line.startswith("note: checkpoint ")]
  assert [n.split()[2] for n in notes] == ["2", "1"]
  assert all(n.endswith("; no checkpoint is left: the run starts over") for n in notes)
