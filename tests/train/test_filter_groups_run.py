"""Dynamic sampling (rl.filter_groups) in the main job end to end: groups are dropped and refilled from the loader
(tests/train/spread_reward_launch.py gives the tiny student's groups a reward that sometimes spreads), the filter/*
counts are logged, and a SIGKILLed run resumes to the same metrics and rollout records as an uninterrupted one:
the refills' draws from the loader are part of its saved position (the main job's resume test: with the filter
off, the loader's plain position is the same path with no refills)."""

import json
from pathlib import Path

import pytest

from processes import ROOT, SMALL, kill_after_checkpoint, launch, launch_command, launch_processes, tiny_run

pytestmark = pytest.mark.slow  # launches training runs in subprocesses

SCRIPT = str(Path(ROOT) / "tests" / "train" / "spread_reward_launch.py")
# 4 SFT + 6 RL steps of 4 prompts x 4 samples, a checkpoint and a held-out evaluation every 2 steps, rollout
# records at every RL step; one extra batch of 4 prompts per step
RUN = tiny_run({"rl.filter_groups": "spread", "rl.filter_groups_max_extra": 4, "logging.rollouts_every": 1}, base=SMALL)


def _metrics(workdir):
  rows = [json.loads(line) for line in (Path(workdir) / "metrics.jsonl").read_text().splitlines()]
  return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("full")
  launch("caprl", *RUN, workdir=workdir, script=SCRIPT)
  return workdir


def test_groups_are_dropped_refilled_and_counted(uninterrupted):
  rows = [r for r in _metrics(uninterrupted) if r["phase"] == "rl" and "loss" in r]
  assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
  for r in rows:
    generated, dropped, rounds = r["filter/generated"], r["filter/dropped"], r["filter/rounds"]
    assert rounds in (1.0, 2.0) and generated == 4 * rounds  # at most the one extra batch of the budget
    assert r["filter/kept_frac"] == pytest.approx((generated - dropped) / generated)
    # a second round is drawn exactly when the first left a slot open
    assert (rounds == 2.0) == (r["filter/first_dropped_frac"] > 0)
    kept = generated - dropped
    assert r["filter/unfilled"] == max(0.0, 4 - kept)
  assert any(r["filter/rounds"] == 2.0 and r["filter/generated"] - r["filter/dropped"] > 0 for r in rows), rows


def test_sigkill_then_rerun_resumes_to_identical_metrics(uninterrupted, tmp_path):
  workdir = tmp_path / "killed"
  command = launch_command("caprl", *RUN, workdir=workdir, script=SCRIPT)
  kill_after_checkpoint(command, workdir, tmp_path / "killed.log", 6)  # an RL-phase checkpoint (global step > 4)
  rerun = launch("caprl", *RUN, workdir=workdir, script=SCRIPT)
  assert "resumed rl" in rerun.stdout + rerun.stderr
  assert _metrics(workdir) == _metrics(uninterrupted)
  records = lambda w: {p.name: p.read_text().replace(str(w), "<workdir>") for p in sorted((w / "rollouts").iterdir())}
  assert list(records(workdir)) == [f"step_{s:06d}.jsonl" for s in range(1, 7)]  # no step twice, none left over
  assert records(workdir) == records(uninterrupted)


def _loader_position(workdir):
  last = max(int(p.name) for p in (Path(workdir) / "checkpoints").glob("[0-9]*") if p.name.isdigit())
  return json.loads((Path(workdir) / "checkpoints" / str(last) / "meta" / "metadata").read_text())["loader"]


def test_packed_micro_batches_give_the_padded_runs_steps(uninterrupted, tmp_path):
  """rl.micro_batch_tokens with the filter: the packed inputs are built from the assembled batch (the refilled
  groups' prompts and completion lengths), so every step equals the padded run's to float rounding, the same
  refills are drawn and the loader ends at the same position. (Every step packed: at these lengths packing saves
  less than rl.packing_min_saving's default, and the steps would run the padded programs.)"""
  packed = ("--config.rl.micro_batch_tokens=256", "--config.rl.packing_min_saving=-1")
  launch("caprl", *RUN, *packed, workdir=tmp_path, script=SCRIPT)
  want = [r for r in _metrics(uninterrupted) if r["phase"] == "rl" and "loss" in r]
  got = [r for r in _metrics(tmp_path) if r["phase"] == "rl" and "loss" in r]
  assert [r["step"] for r in got] == [r["step"] for r in want]
  assert any(r["filter/rounds"] == 2.0 and r["filter/unfilled"] < r["filter/dropped"] for r in got)  # groups moved
  for g, w in zip(got, want):
    assert g["packing/micro_batches"] >= 1 and g["packing/packed"] == 1 and "packing/micro_batches" not in w
    for k in set(w) - {"num_tokens"}:  # a micro-batch's token count depends on the split
      exact = k.startswith("filter/") or not isinstance(w[k], float)
      assert g[k] == (w[k] if exact else pytest.approx(w[k], rel=1e-4, abs=1e-6, nan_ok=True)), k
  assert _loader_position(tmp_path) == _loader_position(uninterrupted)


def test_two_processes_agree_on_the_rounds(tmp_path):
  """Each process fills its own slots; one all-gather of counts per round makes both draw the same rounds (a
  disagreement would hang the next collective), and the logged counts are the global ones."""
  common = tiny_run(
    {
      "rl.batch_size": 2,  # per process
      "rl.num_samples": 4,
      "rl.filter_groups": "spread",
      "rl.filter_groups_max_extra": 4,
      "world.train_scenes": 16,
      "eval.num_images": 0,
      "vision_warmup.steps": 0,
      "vision_warmup.batch_size": None,
    }
  )
  launch_processes("caprl", *common, workdir=tmp_path / "two", script=SCRIPT)
  rows = [r for r in _metrics(tmp_path / "two") if r["phase"] == "rl" and "loss" in r]
  assert [r["step"] for r in rows] == [1, 2]
  assert any(r["filter/rounds"] > 1 for r in rows)  # a refill, so the assembled batch's collectives ran
  for r in rows:
    assert 1 <= r["filter/rounds"] <= 3 and r["filter/generated"] == 2 * 2 * r["filter/rounds"]
    assert 0 <= r["filter/unfilled"] <= 4
