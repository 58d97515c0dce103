"""One-step off-policy RL (rl.off_policy_steps, jaxcap.train.rollouts.off_policy): the loader's look-ahead and its saved
position, which steps queue the next round, and the main job end to end (staleness logged, a resumed run repeats
the uninterrupted one, and judging each group as soon as it is decoded changes nothing). Two processes queueing in
step: tests/train/test_train_distributed.py."""

import json
from pathlib import Path

import pytest

from jaxcap.train.rollouts.off_policy import Lookahead, queues_after


class _Loader:
  """An iterator over 0, 1, 2, ... with the loader's get_state / set_state."""

  def __init__(self):
    self.next_index, self.closed = 0, False

  def __next__(self):
    self.next_index += 1
    return [self.next_index - 1]

  def get_state(self):
    return {"next_index": self.next_index}

  def set_state(self, state):
    self.next_index = state["next_index"]

  def close(self):
    self.closed = True


def test_lookahead_hands_out_the_peeked_batch_and_saves_the_position_before_it():
  loader = Lookahead(_Loader())
  assert next(loader) == [0]
  peeked = loader.peek()
  assert peeked == [1] and loader.peek() is peeked  # one batch ahead, however often asked
  assert loader.get_state() == {"next_index": 1}  # a checkpoint now resumes at the peeked batch
  assert next(loader) is peeked and loader.get_state() == {"next_index": 2}
  assert next(loader) == [2]
  loader.peek()
  loader.set_state({"next_index": 1})  # a restore drops the look-ahead
  assert next(loader) == [1]
  loader.close()
  assert loader.loader.closed


def test_no_round_is_queued_across_a_checkpoint_or_past_the_last_step():
  # 6 steps, a checkpoint after steps 2, 4 (and 6): steps 1, 3, 5 queue the next one's round
  assert [queues_after(s, 6, 2) for s in range(6)] == [True, False, True, False, True, False]
  assert [queues_after(s, 3, 0) for s in range(3)] == [True, True, False]  # no checkpoints: all but the last
  assert [queues_after(s, 4, 5) for s in range(4)] == [True, True, True, False]


def _metrics(workdir):
  rows = [json.loads(line) for line in (Path(workdir) / "metrics.jsonl").read_text().splitlines()]
  return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def _run_flags():
  """SMALL, one-step off-policy through the paged engine (few slots: groups finish at different segments), three
  in ten judgments failing (masked and counted), rollout records with the judge's evidence at every step."""
  from processes import SMALL, tiny_run

  settings = {
    "rl.off_policy_steps": 1,
    "rl.rollout_correction.is_level": "token",
    "eval.every": 0,
    "rollout.engine": "paged",
    "rollout.slots": 6,
    "rollout.segment_steps": 4,
    "judge.failure_rate": 0.3,
    "logging.rollouts_every": 1,
  }
  return tiny_run(settings, base=SMALL)


def _script():
  from processes import ROOT

  return str(Path(ROOT) / "tests" / "train" / "spread_reward_launch.py")


def _rl_steps(workdir):
  return [r for r in _metrics(workdir) if r["phase"] == "rl" and "loss" in r]


def _records(workdir):
  return {p.name: p.read_text().replace(str(workdir), "<workdir>") for p in sorted((workdir / "rollouts").iterdir())}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  """The run above with streamed judging (rl.stream_judging: each group judged as soon as the engine has decoded
  it), with a reward that sometimes spreads, run to its end."""
  from processes import launch

  workdir = tmp_path_factory.mktemp("off_policy_full")
  launch("caprl", *_run_flags(), "--config.rl.stream_judging=true", workdir=workdir, script=_script())
  return workdir


@pytest.mark.slow  # reads the uninterrupted run (a training subprocess)
def test_off_policy_run_logs_staleness_and_the_queued_rounds_log_prob_gap(uninterrupted):
  """The steps after a checkpoint roll out their own batch (staleness 0), the others train on the round queued by
  the step before (staleness 1). (That a resumed run repeats the uninterrupted one is the SIGKILL test below.)"""
  rows = _rl_steps(uninterrupted)
  assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
  assert [r["offpolicy/staleness"] for r in rows] == [0.0, 1.0] * 3
  for r in rows:
    assert r["loss"] == r["loss"] and r["grad_norm"] > 0  # finite, a gradient
    assert "rollout_corr/kl_k3" in r and "rollout_corr/is_truncated_frac" in r
  assert any(r["judge/failed/refused"] > 0 for r in rows) and any(0 < r["judge/valid_fraction"] < 1 for r in rows)
  # a queued round was sampled by the weights one update older than the ones its old log-probs are recomputed
  # with: they differ once the warm-up's learning rate has moved the weights (steps 4, 6: ~2e-4 nats per token
  # here); a round rolled out at its own step differs only by float rounding (~3e-8)
  diff = [abs(r["rollout_corr/log_ppl_diff"]) for r in rows]
  assert max(diff[0::2]) < 1e-6 and min(diff[3], diff[5]) > 1e-5, diff


@pytest.mark.slow  # a killed training run and its rerun, in subprocesses
def test_sigkill_then_rerun_judging_each_batch_equals_the_streamed_uninterrupted_run(uninterrupted, tmp_path):
  """SIGKILL once the RL step-2 checkpoint is on disk: step 3 runs on, queuing step 4's round (rolled out, being
  judged) when the run dies. The queue is not saved, and needs not be: no round is queued across a checkpoint, so
  the rerun rolls step 3 out from the checkpoint's weights as the uninterrupted run did. This run judges each batch
  after its rollout, the uninterrupted one streams groups to the judge as they finish: every metric and rollout
  record (rewards, masks of failed judgments, the judge's evidence) matches."""
  from processes import kill_after_checkpoint, launch, launch_command

  workdir, run, script = tmp_path / "killed", [*_run_flags(), "--config.rl.stream_judging=false"], _script()
  # global step 6 = SFT's 4 + RL's 2
  kill_after_checkpoint(launch_command("caprl", *run, workdir=workdir, script=script), workdir, tmp_path / "log", 6)
  rerun = launch("caprl", *run, workdir=workdir, script=script)
  assert "resumed rl" in rerun.stdout + rerun.stderr
  assert _metrics(workdir) == _metrics(uninterrupted)
  assert list(_records(workdir)) == [f"step_{s:06d}.jsonl" for s in range(1, 7)]  # no step twice, none left over
  assert _records(workdir) == _records(uninterrupted)
