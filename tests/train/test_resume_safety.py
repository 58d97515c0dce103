"""Runs that cannot silently go wrong (issue 16, cases 2-5): a rerun with a changed config is refused unless the
change leaves the run the same or the user opts in; one trainer per workdir and one annotator per output file;
config errors name the field; an error mid-run completes the checkpoint being saved and exits with one line.

Every case checks the exact message or the exact files left. Training runs are tiny SFT-only subprocesses."""

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from jaxcap.train.config import validate

# jaxcap.locking and jaxcap.train.resume are imported inside the tests that use them, so that the other tests
# also run (and fail for what they check) against a checkout from before these modules existed.

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu"}
TINY = [
  "--config=configs/caprl.py",
  "--config.sft.steps=3",
  "--config.sft.batch_size=4",
  "--config.rl.steps=0",
  "--config.sft.max_target_tokens=16",
  "--config.world.train_scenes=8",
  "--config.world.eval_scenes=4",
  "--config.eval.num_images=0",
  "--config.checkpoint.every=1",
  "--config.model.student.text_layers=1",
  "--config.model.student.vision_depth=1",
  "--config.vision_warmup.steps=0",
  "--config.export.hf=False",
]


def _launch(workdir, *extra, fault_after_save=None, timeout=300):
  script = ["tests/train/fault_launch.py"] if fault_after_save is not None else ["-m", "jaxcap.launch"]
  env = {**ENV, "JAXCAP_FAULT_AFTER_SAVE": str(fault_after_save if fault_after_save is not None else -1)}
  cmd = [sys.executable, *script, *TINY, f"--config.workdir={workdir}", *extra]
  return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def _config(**overrides):
  spec = importlib.util.spec_from_file_location("caprl", ROOT / "configs" / "caprl.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config()
  for key, value in overrides.items():
    *path, leaf = key.split(".")
    node = c
    for k in path:
      node = node[k]
    node[leaf] = value
  return c


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


def test_rerun_that_alters_the_run_is_refused_listing_each_change(faulted):
  workdir, _ = faulted
  saved = (workdir / "config.json").read_bytes()
  out = _launch(workdir, "--config.sft.optim.lr=0.001", "--config.sft.batch_size=2", "--config.eval.every=5")
  assert out.returncode == 1
  assert out.stderr == (
    f"error: ConfigChangedError: the config differs from the run's in {workdir} (latest checkpoint: sft step 2; "
    f"saved config: {workdir}/config.json); these changes alter the run:\n"
    "  sft.batch_size: 4 -> 2\n"
    "  sft.optim.lr: 0.002 -> 0.001\n"
    "To continue this run under them anyway, add --config.resume_changes=allow; to start a separate run, use a "
    "new --config.workdir; to resume as it was, drop the changes.\n"
  )
  assert (workdir / "config.json").read_bytes() == saved and _checkpoints(workdir) == ["1", "2"]


def test_rerun_with_more_steps_resumes(faulted, tmp_path):
  workdir = tmp_path / "more"
  shutil.copytree(faulted[0], workdir)
  out = _launch(workdir, "--config.sft.steps=4", "--config.eval.every=5")
  assert out.returncode == 0, out.stderr[-3000:]
  assert "resumed sft at step 2" in out.stdout
  assert (
    "resuming with changed settings that do not alter the run: eval.every: 25 -> 5; sft.steps: 3 -> 4 (the cosine "
    f"learning-rate schedule now spans 4 steps); workdir: '{faulted[0]}' -> '{workdir}'\n"
  ) in out.stderr
  assert _checkpoints(workdir) == ["3", "4"]
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4]
  assert json.loads((workdir / "config.json").read_text())["config"]["sft"]["steps"] == 4
  assert len((workdir / "config_changes.jsonl").read_text().splitlines()) == 1


def test_state_structure_change_is_refused_in_words_also_without_a_saved_config(faulted, tmp_path):
  """Freezing / unfreezing the tower mid-SFT changes the optimizer state's tree (as switching the KL term does
  mid-RL): refused from the saved config before anything is built, and, in a workdir without one, at the restore
  in words instead of Orbax's tree mismatch."""
  workdir = tmp_path / "w"
  shutil.copytree(faulted[0], workdir)
  out = _launch(workdir, "--config.sft.freeze_vision=False")
  assert out.returncode == 1
  assert out.stderr.splitlines()[1] == (
    "  sft.freeze_vision: True -> False (the checkpoint's optimizer state has none for the vision tower)"
  )
  (workdir / "config.json").unlink()
  out = _launch(workdir, "--config.sft.freeze_vision=False")
  assert out.returncode == 1
  assert out.stderr.endswith(
    f"error: ConfigChangedError: checkpoint 2 in {workdir}/checkpoints does not fit the sft state this config builds "
    "(ValueError: User-provided restore item and on-disk value metadata tree structures do not match). The config "
    "changed the train state's structure (e.g. rl.loss.kl_coef switched between 0 and > 0, sft.freeze_vision, the "
    "model's shapes); rerun with the config the run was started with, or start a separate run with a new "
    "--config.workdir.\n"
  )
  assert not (workdir / "config.json").exists() and _checkpoints(workdir) == ["1", "2"]


def _saved(tmp_path, config, process_count=None):
  """A workdir whose run was started with `config` (and, if given, on `process_count` processes)."""
  from jaxcap.train import resume

  resume.record(config, tmp_path, [])
  if process_count is not None:
    saved = json.loads((tmp_path / resume.CONFIG_FILE).read_text())
    saved["runtime"]["process_count"] = process_count
    (tmp_path / resume.CONFIG_FILE).write_text(json.dumps(saved))
  return tmp_path


def _rl_step_2():
  from jaxcap.train import resume

  return resume.Position("rl", 2, 1602)  # the default config: 1600 SFT steps, then RL


def test_changed_model_data_reward_optimiser_and_world_size_are_listed(tmp_path):
  from jaxcap.train import resume

  workdir = _saved(tmp_path, _config(), process_count=2)
  new = _config(
    **{"rl.optim.lr": 1e-3, "reward.caprl.preset": "released_code", "rl.num_samples": 4, "model.dtype": "bfloat16"}
  )
  new.data.train_manifest, new.data.eval_manifest = "train.jsonl", "heldout.jsonl"
  with pytest.raises(resume.ConfigChangedError) as e:
    resume.check(new, workdir, _rl_step_2())
  assert str(e.value) == (
    f"the config differs from the run's in {workdir} (latest checkpoint: rl step 2; saved config: "
    f"{workdir}/config.json); these changes alter the run:\n"
    "  data.eval_manifest: '' -> 'heldout.jsonl'\n"
    "  data.train_manifest: '' -> 'train.jsonl'\n"
    "  model.dtype: 'float32' -> 'bfloat16'\n"
    "  reward.caprl.preset: 'paper' -> 'released_code'\n"
    "  rl.num_samples: 8 -> 4\n"
    "  rl.optim.lr: 0.0001 -> 0.001\n"
    "  runtime.process_count: 2 -> 1\n"
    "To continue this run under them anyway, add --config.resume_changes=allow; to start a separate run, use a "
    "new --config.workdir; to resume as it was, drop the changes."
  )
  new.resume_changes = "allow"
  assert resume.check(new, workdir, _rl_step_2())[:2] == [
    "resuming with changes that alter the run (--config.resume_changes=allow):",
    "  data.eval_manifest: '' -> 'heldout.jsonl'",
  ]


def test_settings_that_do_not_alter_the_run_may_change(tmp_path):
  from jaxcap.train import resume

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
  assert resume.check(new, workdir, _rl_step_2()) == [
    "resuming with changed settings that do not alter the run: checkpoint.every: 25 -> 5; eval.every: 25 -> 10; "
    "judge.endpoints: '' -> 'http://judge1:8000/v1'; judge.max_concurrency: 64 -> 8; rl.steps: 100 -> 150",
    "these changes have no effect (their phase is over): sft.optim.lr: 0.002 -> 0.001",
  ]


def test_phase_with_no_steps_left_and_kl_switched_off_are_refused_even_when_allowed(tmp_path):
  from jaxcap.train import resume

  workdir = _saved(tmp_path, _config())
  new = _config(**{"sft.steps": 0, "resume_changes": "allow"})
  with pytest.raises(resume.ConfigChangedError) as e:
    resume.check(new, workdir, resume.Position("sft", 2, 2))
  assert str(e.value) == (
    f"cannot resume the run in {workdir} (latest checkpoint: sft step 2; saved config: {workdir}/config.json): its "
    "checkpoint cannot continue under these changes:\n"
    "  sft.steps: 1600 -> 0 (the latest checkpoint is at sft step 2, and sft.steps=0 would skip that phase; keep "
    "--config.sft.steps >= 2)\n"
    "Rerun with the saved values, or start a separate run with a new --config.workdir "
    "(--config.resume_changes=allow does not apply to these)."
  )
  new = _config(**{"rl.loss.kl_coef": 0.0, "resume_changes": "allow"})
  with pytest.raises(resume.ConfigChangedError) as e:
    resume.check(new, workdir, _rl_step_2())
  assert str(e.value).splitlines()[1] == (
    "  rl.loss.kl_coef: 0.05 -> 0.0 (switches the KL term off mid-RL: the checkpoint at rl step 2 holds a reference "
    "policy; keep rl.loss.kl_coef > 0 (any positive value))"
  )
  # before RL began the RL state is built fresh: switching KL off is an ordinary change
  assert resume.check(new, workdir, resume.Position("sft", 2, 2))[1] == "  rl.loss.kl_coef: 0.05 -> 0.0"


def test_world_is_never_regenerated_under_a_checkpoint(tmp_path):
  """Also without a saved config (a workdir from before it was saved): the world on disk is compared."""
  from jaxcap.train import resume
  from jaxcap.world import student as embedded

  c = _config(**{"world.train_scenes": 4, "world.eval_scenes": 2})
  train, _ = embedded.build_world_manifests(c, tmp_path)
  before = train.read_bytes()
  new = _config(**{"world.train_scenes": 6, "world.eval_scenes": 2, "resume_changes": "allow"})
  with pytest.raises(resume.ConfigChangedError) as e:
    resume.check(new, tmp_path, _rl_step_2())
  assert str(e.value).splitlines()[1] == (
    f"  world.train_scenes: 4 -> 6 (the synthetic training world in {tmp_path}/world/train would be regenerated "
    "under the checkpoint's data position)"
  )
  assert train.read_bytes() == before


# -- case 3: locks -------------------------------------------------------------------------------------------


def _holder_line(lock_file):
  h = json.loads(Path(lock_file).read_text())
  assert (h["pid"], h["host"]) == (os.getpid(), socket.gethostname())
  return f"pid {h['pid']} on host {h['host']}, started {h['started']}, command: {h['command']}"


def test_second_trainer_on_a_workdir_is_refused_naming_the_holder(tmp_path):
  from jaxcap.locking import lock_workdir

  held = lock_workdir(tmp_path)
  try:
    out = _launch(tmp_path, timeout=120)
    assert out.returncode == 1
    assert out.stderr == (
      f"error: LockHeldError: workdir {tmp_path} is in use by another process: {_holder_line(held.path)} "
      f"(lock file {tmp_path}/jaxcap.lock). Wait for it to finish or stop it, or use another --config.workdir "
      "for a separate run.\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jaxcap.lock"]  # nothing of the holder's touched
  finally:
    held.release()


def test_second_annotator_on_an_output_is_refused_naming_the_holder(tmp_path):
  from jaxcap import caption
  from jaxcap.locking import LockHeldError, lock_output

  out = tmp_path / "captions.jsonl"
  held = lock_output(out)
  try:
    with pytest.raises(LockHeldError) as e:
      caption.main(["--checkpoint", str(tmp_path / "ckpt"), "--images", str(tmp_path), "--out", str(out)])
    assert str(e.value) == (
      f"output {out} is in use by another process: {_holder_line(held.path)} (lock file {out}.lock). Wait for it "
      "to finish or stop it, or pass another --out for a separate run."
    )
  finally:
    held.release()


def test_lock_of_a_dead_process_is_taken_over_with_a_note(tmp_path, capsys):
  from jaxcap.locking import lock_workdir

  code = "import os, sys; from jaxcap.locking import lock_workdir; held = lock_workdir(sys.argv[1]); os._exit(0)"
  dead = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=ENV, cwd=ROOT, capture_output=True)
  assert dead.returncode == 0, dead.stderr
  left = json.loads((tmp_path / "jaxcap.lock").read_text())
  lock = lock_workdir(tmp_path)
  assert lock.recovered == left
  assert capsys.readouterr().err == (
    f"note: took over the lock of workdir {tmp_path} left by pid {left['pid']} on host {left['host']}, started "
    f"{left['started']}, command: {left['command']} (no longer running; its lock file {tmp_path}/jaxcap.lock was "
    "stale)\n"
  )
  lock.release()
  assert (tmp_path / "jaxcap.lock").read_text() == ""
  lock_workdir(tmp_path).release()  # a cleanly released lock is taken without a note
  assert capsys.readouterr().err == ""


# -- case 5: config errors with a name -----------------------------------------------------------------------


@pytest.mark.parametrize(
  "overrides, message",
  [
    ({"rl.micro_batches": 0}, "rl.micro_batches=0: must be >= 1 (1 = no accumulation)"),
    ({"sft.batch_size": 0}, "sft.batch_size=0: must be >= 1 (records per process per step)"),
    ({"rl.batch_size": -2}, "rl.batch_size=-2: must be >= 1 (records per process per step)"),
    ({"checkpoint.max_to_keep": 0}, "checkpoint.max_to_keep=0: must be >= 1, or the run cannot resume"),
    ({"sampling.top_p": 0.0}, "sampling.top_p=0.0: must be in (0, 1]"),
    ({"rl.optim.warmup_steps": -1}, "rl.optim.warmup_steps=-1: must be >= 0"),
    ({"rl.optim.schedule": "cosin"}, "rl.optim.schedule='cosin': use cosine, linear or constant"),
    (
      {"rl.loss.dual_clip_c": 1.0},
      "rl.loss.dual_clip_c=1.0: must exceed 1 (it caps a negative advantage's token loss at c x A)",
    ),
    ({"eval.batch_size": 0}, "eval.batch_size=0: must be >= 1"),
    (
      {"world.train_scenes": 12},
      "world.train_scenes=12 cannot fill one sft batch of sft.batch_size=16; raise world.train_scenes or lower the "
      "batch size",
    ),
    (
      {"world.min_objects": 3},
      "world.min_objects=3, max_objects=2: need 1 <= min_objects <= max_objects <= 6",
    ),
    (
      {"resume_changes": "yes"},
      "resume_changes='yes': use 'refuse' (stop on changes that alter a resumed run) or 'allow'",
    ),
  ],
)
def test_config_error_names_the_field(overrides, message):
  with pytest.raises(ValueError) as e:
    validate(_config(**overrides))
  assert str(e.value) == f"invalid config:\n  - {message}"


def test_unknown_field_names_the_closest_existing_ones():
  out = subprocess.run(
    [sys.executable, "-m", "jaxcap.launch", "--config=configs/caprl.py", "--config.rl.lr=1e-3"],
    env=ENV,
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert out.returncode == 2
  assert out.stderr == (
    "error: --config.rl.lr: configs/caprl.py has no field 'rl.lr'. Closest existing fields: rl.optim.lr, "
    "sft.optim.lr, vision_warmup.lr\n"
  )
