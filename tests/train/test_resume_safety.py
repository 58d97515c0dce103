"""Runs that cannot silently go wrong (issue 16, cases 2-5): a rerun with a changed config is refused unless the
change leaves the run the same or the user opts in; one trainer per workdir and one annotator per output file;
config errors name the field; an error mid-run completes the checkpoint being saved and exits with one line.

Every case checks that its message names the field (or the file, or the holder) and the fix, and the exact files
left. Training runs are tiny SFT-only subprocesses (the tests that start one are marked slow)."""

import json
import os
import re
import shutil
import socket
import sys
from pathlib import Path

import pytest

from jaxcap.config_files import validate
from processes import SFT_CHECKPOINTS, cpu_env, launch, load_config, run_command, tiny_run

# jaxcap.locking and jaxcap.train.shell.resume are imported inside the tests that use them, so that the other tests
# also run (and fail for what they check) against a checkout from before these modules existed.

# 3 SFT steps, a checkpoint after each, no RL, no evaluation
TINY = tiny_run(SFT_CHECKPOINTS)
FIXES = ("--config.resume_changes=allow", "--config.workdir")  # the two ways on past a refused change


def _launch(workdir, *extra, fault_after_save=None, timeout=300):
  script = "tests/train/fault_launch.py" if fault_after_save is not None else None
  env = cpu_env(1, JAXCAP_FAULT_AFTER_SAVE=str(fault_after_save if fault_after_save is not None else -1))
  return launch("caprl", *TINY, *extra, workdir=workdir, env=env, timeout=timeout, script=script, check=False)


def _config(**overrides):
  return load_config("caprl", **overrides)


def _listed(message: str) -> dict[str, str]:
  """The changes a message lists one per line ('  key: old -> new (why)'): key -> the rest of its line."""
  return dict(re.findall(r"^  ([\w.]+): (.*)$", message, re.M))


def _noted(note: str, head: str) -> dict[str, str]:
  """The changes of a one-line note ('<head>: k: a -> b; k2: c -> d'): key -> 'a -> b'."""
  assert note.startswith(head + ": "), note
  return dict(item.split(": ", 1) for item in note[len(head) + 2 :].split("; "))


def _checkpoints(workdir):
  return sorted(p.name for p in (Path(workdir) / "checkpoints").iterdir())


# -- case 4: an error mid-run --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def faulted(tmp_path_factory):
  """A run that fails right after starting the (asynchronous) save of checkpoint 2 of 3, leaving a thread that
  never ends. Returns (workdir, the finished process)."""
  workdir = tmp_path_factory.mktemp("faulted")
  out = _launch(workdir, fault_after_save=2, timeout=240)
  return workdir, out


@pytest.mark.slow  # a training run in a subprocess
def test_error_mid_run_completes_the_checkpoint_in_flight_and_exits_with_one_error(faulted):
  workdir, out = faulted
  assert out.returncode == 1, out.stderr[-3000:]  # and it exited at all: a stuck thread does not hold it
  # checkpoint 2 finished (not left as 2.orbax-checkpoint-tmp), nothing else left behind
  assert _checkpoints(workdir) == ["1", "2"]
  assert (workdir / "checkpoints" / "2" / "_CHECKPOINT_METADATA").exists()
  assert out.stderr.endswith(
    f"error: RuntimeError: injected fault after starting the save of step 2\n(traceback: {workdir}/error.log)\n"
  )
  assert out.stderr.count("error:") == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
  assert "injected fault" in (workdir / "error.log").read_text()
  assert (workdir / "jaxcap.lock").read_text() == ""  # released


# -- case 2: resuming with a changed config ------------------------------------------------------------------


@pytest.mark.slow
def test_rerun_that_alters_the_run_is_refused_listing_each_change(faulted):
  workdir, _ = faulted
  saved = (workdir / "config.json").read_bytes()
  out = _launch(workdir, "--config.sft.optim.lr=0.001", "--config.sft.batch_size=2", "--config.eval.every=5")
  assert out.returncode == 1
  err = out.stderr
  assert err.startswith("error: ConfigChangedError: ") and err.count("error:") == 1, err[-3000:]
  assert str(workdir) in err and "sft step 2" in err and f"{workdir}/config.json" in err  # the run, its checkpoint
  changes = _listed(err)  # each change that alters the run, in order; eval.every does not: it is not listed
  assert list(changes) == ["sft.batch_size", "sft.optim.lr"], err
  assert changes["sft.batch_size"] == "4 -> 2" and changes["sft.optim.lr"].endswith("-> 0.001")
  assert all(fix in err for fix in FIXES), err
  assert (workdir / "config.json").read_bytes() == saved and _checkpoints(workdir) == ["1", "2"]


@pytest.mark.slow
def test_rerun_with_more_steps_resumes(faulted, tmp_path):
  workdir = tmp_path / "more"
  shutil.copytree(faulted[0], workdir)
  out = _launch(workdir, "--config.sft.steps=4", "--config.eval.every=5")
  assert out.returncode == 0, out.stderr[-3000:]
  assert "resumed sft at step 2" in out.stdout
  head = "resuming with changed settings that do not alter the run"
  [note] = [line for line in out.stderr.splitlines() if line.startswith(head)]
  noted = _noted(note, head)
  assert list(noted) == ["eval.every", "sft.steps", "workdir"], note
  assert noted["eval.every"].endswith("-> 5") and noted["workdir"] == f"'{faulted[0]}' -> '{workdir}'"
  assert noted["sft.steps"].startswith("3 -> 4 (") and "schedule now spans 4 steps" in noted["sft.steps"]
  assert _checkpoints(workdir) == ["3", "4"]
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4]
  assert json.loads((workdir / "config.json").read_text())["config"]["sft"]["steps"] == 4
  assert len((workdir / "config_changes.jsonl").read_text().splitlines()) == 1


@pytest.mark.slow
def test_state_structure_change_is_refused_in_words_also_without_a_saved_config(faulted, tmp_path):
  """Freezing / unfreezing the tower mid-SFT changes the optimizer state's tree (as switching the KL term does
  mid-RL): refused from the saved config before anything is built, and, in a workdir without one, at the restore
  in words instead of Orbax's tree mismatch."""
  workdir = tmp_path / "w"
  shutil.copytree(faulted[0], workdir)
  out = _launch(workdir, "--config.sft.freeze_vision=False")
  assert out.returncode == 1
  changes = _listed(out.stderr)
  assert list(changes) == ["sft.freeze_vision"], out.stderr[-3000:]
  assert changes["sft.freeze_vision"].startswith("True -> False (") and "vision tower" in changes["sft.freeze_vision"]
  assert "--config.workdir" in out.stderr and "--config.resume_changes=allow does not apply" in out.stderr
  (workdir / "config.json").unlink()
  out = _launch(workdir, "--config.sft.freeze_vision=False")
  assert out.returncode == 1
  [error] = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
  assert error.startswith(f"error: ConfigChangedError: checkpoint 2 in {workdir}/checkpoints does not fit"), error
  assert "sft.freeze_vision" in error and "rl.loss.kl_coef" in error  # the fields that change the state's tree
  assert "started with" in error and "--config.workdir" in error  # the fixes
  assert "Traceback" not in out.stderr and out.stderr.endswith(f"{error}\n(traceback: {workdir}/error.log)\n")
  assert not (workdir / "config.json").exists() and _checkpoints(workdir) == ["1", "2"]


def _saved(tmp_path, config, process_count=None):
  """A workdir whose run was started with `config` (and, if given, on `process_count` processes)."""
  from jaxcap.train.shell import resume

  resume.record(config, tmp_path, [])
  if process_count is not None:
    saved = json.loads((tmp_path / resume.CONFIG_FILE).read_text())
    saved["runtime"]["process_count"] = process_count
    (tmp_path / resume.CONFIG_FILE).write_text(json.dumps(saved))
  return tmp_path


def _rl_step_2():
  from jaxcap.train.shell import resume

  return resume.Position("rl", 2, 1602)  # the default config: 1600 SFT steps, then RL


def test_changed_model_data_reward_optimiser_and_world_size_are_listed(tmp_path):
  from jaxcap.train.shell import resume

  workdir = _saved(tmp_path, _config(), process_count=2)
  new = _config(
    **{"rl.optim.lr": 1e-3, "reward.caprl.preset": "released_code", "rl.num_samples": 4, "model.dtype": "bfloat16"}
  )
  new.data.train_manifest, new.data.eval_manifest = "train.jsonl", "heldout.jsonl"
  with pytest.raises(resume.ConfigChangedError) as e:
    resume.check(new, workdir, _rl_step_2())
  message = str(e.value)
  assert str(workdir) in message and "rl step 2" in message and f"{workdir}/config.json" in message
  new_values = {
    "data.eval_manifest": "'heldout.jsonl'",
    "data.train_manifest": "'train.jsonl'",
    "model.dtype": "'bfloat16'",
    "reward.caprl.preset": "'released_code'",
    "rl.num_samples": "4",
    "rl.optim.lr": "0.001",
    "runtime.process_count": "1",
  }
  changes = _listed(message)  # one line each, in order, naming the field and its new value
  assert list(changes) == list(new_values), message
  assert all(changes[k].endswith(f" -> {v}") for k, v in new_values.items()), message
  assert changes["runtime.process_count"] == "2 -> 1"
  assert all(fix in message for fix in FIXES), message
  new.resume_changes = "allow"
  notes = resume.check(new, workdir, _rl_step_2())
  assert notes[0].startswith("resuming with changes that alter the run") and FIXES[0] in notes[0]
  assert notes[1].startswith("  data.eval_manifest: ") and notes[1].endswith("-> 'heldout.jsonl'")


def test_settings_that_do_not_alter_the_run_may_change(tmp_path):
  from jaxcap.train.shell import resume

  workdir = _saved(tmp_path, _config())
  new = _config(
    **{
      "rl.steps": 150,
      "eval.every": 10,
      "checkpoint.every": 5,
      "judge.endpoints": "http://judge1:8000/v1",
      "judge.max_concurrency": 8,
      "sft.optim.lr": 1e-3,  # SFT is over
    }
  )
  allowed, inert = resume.check(new, workdir, _rl_step_2())
  allowed = _noted(allowed, "resuming with changed settings that do not alter the run")
  new_values = {
    "checkpoint.every": "5",
    "eval.every": "10",
    "judge.endpoints": "'http://judge1:8000/v1'",
    "judge.max_concurrency": "8",
    "rl.steps": "150",
  }
  assert list(allowed) == list(new_values) and all(allowed[k].endswith(f"-> {v}") for k, v in new_values.items())
  inert = _noted(inert, "these changes have no effect (their phase is over)")
  assert list(inert) == ["sft.optim.lr"] and inert["sft.optim.lr"].endswith("-> 0.001")


def test_phase_with_no_steps_left_and_kl_switched_off_are_refused_even_when_allowed(tmp_path):
  from jaxcap.train.shell import resume

  workdir = _saved(tmp_path, _config())
  new = _config(**{"sft.steps": 0, "resume_changes": "allow"})
  with pytest.raises(resume.ConfigChangedError) as e:
    resume.check(new, workdir, resume.Position("sft", 2, 2))
  message = str(e.value)
  assert str(workdir) in message and "sft step 2" in message
  changes = _listed(message)
  assert list(changes) == ["sft.steps"] and changes["sft.steps"].split(" (")[0].endswith("-> 0"), message
  assert "keep --config.sft.steps >= 2" in changes["sft.steps"]  # the fix, with the bound the checkpoint sets
  assert "--config.workdir" in message and "--config.resume_changes=allow does not apply" in message
  new = _config(**{"rl.loss.kl_coef": 0.0, "resume_changes": "allow"})
  with pytest.raises(resume.ConfigChangedError) as e:
    resume.check(new, workdir, _rl_step_2())
  changes = _listed(str(e.value))
  assert list(changes) == ["rl.loss.kl_coef"] and changes["rl.loss.kl_coef"].split(" (")[0].endswith("-> 0.0")
  assert "KL term off" in changes["rl.loss.kl_coef"] and "keep rl.loss.kl_coef > 0" in changes["rl.loss.kl_coef"]
  # before RL began the RL state is built fresh: switching KL off is an ordinary change (no reason, no refusal)
  notes = resume.check(new, workdir, resume.Position("sft", 2, 2))
  assert notes[1].startswith("  rl.loss.kl_coef: ") and notes[1].endswith("-> 0.0")


def test_world_is_never_regenerated_under_a_checkpoint(tmp_path):
  """Also without a saved config (a workdir from before it was saved): the world on disk is compared."""
  from jaxcap.train.shell import resume
  from jaxcap.world import student as embedded

  c = _config(**{"world.train_scenes": 4, "world.eval_scenes": 2})
  train, _ = embedded.build_world_manifests(c, tmp_path)
  before = train.read_bytes()
  new = _config(**{"world.train_scenes": 6, "world.eval_scenes": 2, "resume_changes": "allow"})
  with pytest.raises(resume.ConfigChangedError) as e:
    resume.check(new, tmp_path, _rl_step_2())
  changes = _listed(str(e.value))
  assert list(changes) == ["world.train_scenes"] and changes["world.train_scenes"].startswith("4 -> 6 ("), str(e.value)
  assert f"{tmp_path}/world/train" in changes["world.train_scenes"] and "regenerated" in changes["world.train_scenes"]
  assert "--config.workdir" in str(e.value)
  assert train.read_bytes() == before


# -- case 3: locks -------------------------------------------------------------------------------------------


def _holder_line(lock_file):
  h = json.loads(Path(lock_file).read_text())
  assert (h["pid"], h["host"]) == (os.getpid(), socket.gethostname())
  return f"pid {h['pid']} on host {h['host']}, started {h['started']}, command: {h['command']}"


@pytest.mark.slow  # the trainer in a subprocess
def test_second_trainer_on_a_workdir_is_refused_naming_the_holder(tmp_path):
  from jaxcap.locking import lock_workdir

  held = lock_workdir(tmp_path)
  try:
    out = _launch(tmp_path, timeout=120)
    assert out.returncode == 1
    err = out.stderr
    assert err.startswith(f"error: LockHeldError: workdir {tmp_path} ") and err.count("\n") == 1, err[-3000:]
    assert _holder_line(held.path) in err and f"{tmp_path}/jaxcap.lock" in err  # the holder and the lock file
    assert "stop it" in err and "--config.workdir" in err  # the fixes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jaxcap.lock"]  # nothing of the holder's touched
  finally:
    held.release()


def test_second_annotator_on_an_output_is_refused_naming_the_holder(tmp_path):
  from hf_reference import save_tiny_checkpoint

  from jaxcap import caption
  from jaxcap.locking import LockHeldError, lock_output
  from jaxcap.models import qwen25vl_presets

  save_tiny_checkpoint(qwen25vl_presets.tiny(), 0, tmp_path / "ckpt")  # a real checkpoint: only the lock refuses
  out = tmp_path / "captions.jsonl"
  held = lock_output(out)
  try:
    with pytest.raises(LockHeldError) as e:
      caption.main(["--checkpoint", str(tmp_path / "ckpt"), "--images", str(tmp_path), "--out", str(out)])
    message = str(e.value)
    assert message.startswith(f"output {out} ") and _holder_line(held.path) in message and f"{out}.lock" in message
    assert "stop it" in message and "another --out" in message  # the fixes
  finally:
    held.release()


def test_lock_of_a_dead_process_is_taken_over_with_a_note(tmp_path, capsys):
  from jaxcap.locking import lock_workdir

  code = "import os, sys; from jaxcap.locking import lock_workdir; held = lock_workdir(sys.argv[1]); os._exit(0)"
  run_command([sys.executable, "-c", code, str(tmp_path)])  # a process that took the lock and died (no jax)
  left = json.loads((tmp_path / "jaxcap.lock").read_text())
  lock = lock_workdir(tmp_path)
  assert lock.recovered == left
  note = capsys.readouterr().err
  assert note.startswith(f"note: took over the lock of workdir {tmp_path} ") and note.count("\n") == 1, note
  holder = f"pid {left['pid']} on host {left['host']}, started {left['started']}, command: {left['command']}"
  assert holder in note and f"{tmp_path}/jaxcap.lock" in note and "no longer running" in note
  lock.release()
  assert (tmp_path / "jaxcap.lock").read_text() == ""
  lock_workdir(tmp_path).release()  # a cleanly released lock is taken without a note
  assert capsys.readouterr().err == ""


# -- case 5: config errors with a name -----------------------------------------------------------------------


@pytest.mark.parametrize(
  "overrides, field, fix",
  [
    ({"rl.micro_batches": 0}, "rl.micro_batches=0", ">= 1"),
    ({"sft.batch_size": 0}, "sft.batch_size=0", ">= 1"),
    ({"rl.batch_size": -2}, "rl.batch_size=-2", ">= 1"),
    ({"checkpoint.max_to_keep": 0}, "checkpoint.max_to_keep=0", ">= 1"),
    ({"sampling.top_p": 0.0}, "sampling.top_p=0.0", "(0, 1]"),
    ({"rl.optim.warmup_steps": -1}, "rl.optim.warmup_steps=-1", ">= 0"),
    ({"rl.optim.schedule": "cosin"}, "rl.optim.schedule='cosin'", "cosine"),
    ({"rl.loss.dual_clip_c": 1.0}, "rl.loss.dual_clip_c=1.0", "exceed 1"),
    ({"eval.batch_size": 0}, "eval.batch_size=0", ">= 1"),
    ({"world.train_scenes": 12}, "world.train_scenes=12", "raise world.train_scenes or lower the batch size"),
    ({"world.min_objects": 3}, "world.min_objects=3", "min_objects <= max_objects"),
    ({"resume_changes": "yes"}, "resume_changes='yes'", "'refuse'"),
    ({"model.family": "qwen4"}, "model.family='qwen4'", "qwen3_vl"),
  ],
)
def test_config_error_names_the_field(overrides, field, fix):
  """One error per bad value, naming the field as set and what it must be (or what to change)."""
  with pytest.raises(ValueError) as e:
    validate(_config(**overrides))
  head, *errors = str(e.value).split("\n  - ")
  assert head == "invalid config:" and len(errors) == 1, str(e.value)
  assert errors[0].startswith(field) and fix in errors[0], errors[0]


@pytest.mark.slow  # the trainer in a subprocess
def test_unknown_field_names_the_closest_existing_ones():
  """(Also the check that an unknown key on the command line is rejected before any compute.)"""
  out = launch("caprl", "--config.rl.lr=1e-3", timeout=120, check=False)
  assert out.returncode == 2
  [error] = out.stderr.splitlines()  # one line, no traceback
  assert error.startswith("error: --config.rl.lr: ") and "configs/caprl.py" in error and "'rl.lr'" in error, error
  closest = error.split("Closest existing fields: ")[1].split(", ")
  assert closest[0] == "rl.optim.lr" and "sft.optim.lr" in closest  # the fix: the fields meant
