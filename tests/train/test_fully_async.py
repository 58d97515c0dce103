"""Asynchronous RL (rl.max_staleness, rollout.devices; jaxcap.train.rollouts.fully_async): the loader's look-ahead and its
saved position, the version rule (which weights roll out which round, whatever the timing), the weights moved to
the rollout devices without a host copy, and the main job end to end on rollout devices of its own (staleness
logged; a SIGKILLed and rerun run repeats the uninterrupted one). Two processes, colocated: tests/train/
test_train_distributed.py."""

import json
import random
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxcap.train.rollouts.fully_async import FullyAsync, rollout_version, window_end
from jaxcap.train.rollouts.loader import Ahead
from jaxcap.train.rollouts.placement import WeightSync, rollout_mesh, split_devices


class _Batch(list):
  @property
  def prompts(self):
    return tuple(self)


class _Loader:
  """An iterator over batches [0], [1], [2], ... with the loader's get_state / set_state."""

  def __init__(self):
    self.next_index, self.closed = 0, False

  def __next__(self):
    self.next_index += 1
    return _Batch([self.next_index - 1])

  def get_state(self):
    return {"next_index": self.next_index}

  def set_state(self, state):
    self.next_index = state["next_index"]

  def close(self):
    self.closed = True


def test_ahead_hands_out_the_peeked_batches_in_order_and_saves_the_position_before_them():
  closed = []
  loader = Ahead(_Loader(), on_close=lambda: closed.append(True))
  assert next(loader) == [0]
  second = loader.peek(2)
  assert second == [2] and loader.peek(1) == [1] and loader.peek(2) is second  # drawn once, however often asked
  assert loader.get_state() == {"next_index": 1}  # a checkpoint now resumes at the first batch drawn ahead
  assert next(loader) == [1] and loader.get_state() == {"next_index": 2}
  assert next(loader) is second and loader.get_state() == {"next_index": 3}
  assert next(loader) == [3]
  loader.peek(3)
  loader.set_state({"next_index": 1})  # a restore drops the look-ahead
  assert next(loader) == [1]
  loader.close()
  assert closed and loader.loader.closed


def test_no_round_is_queued_across_a_checkpoint_and_each_round_has_its_version():
  # 7 steps, a checkpoint after steps 3, 6 (0-based 2, 5) and the last: windows [0, 3), [3, 6), [6, 7)
  assert [window_end(s, 7, 3) for s in range(7)] == [3, 3, 3, 6, 6, 6, 7]
  assert [window_end(s, 4, 0) for s in range(4)] == [4] * 4
  # k = 2 in the window starting at 3: rounds 3, 4, 5 from versions 3, 3, 3; then 6 -> 4, 7 -> 5
  assert [rollout_version(r, 3, 2) for r in range(3, 8)] == [3, 3, 3, 4, 5]
  assert [rollout_version(r, 0, 1) for r in range(4)] == [0, 0, 1, 2]


class _Source:
  """The schedule's view of a `RolloutSource`: rollouts that record which weights made them, after a random delay
  (a rollout thread's timing), judged in submission order."""

  def __init__(self, delays: bool):
    self.rng, self.delays = random.Random(0), delays
    self.made: dict[int, int] = {}  # round -> the version that rolled it out
    self.submitted: list[int] = []
    self.threads: set[str] = set()
    self.sampler = self

  def place(self, prompts):
    return ("placed", prompts)

  def generate(self, params, batch, key, step, placed=None):
    from jaxcap.train.rollouts.source import Generated

    if self.delays:
      time.sleep(self.rng.random() * 0.02)
    self.made[step] = params["version"]
    self.threads.add(threading.current_thread().name)
    return Generated(batch, rollouts=step)

  def submit(self, gen, step):
    self.submitted.append(step)
    future = Future()
    future.set_result(_Rewards())
    return future

  def settle(self):
    pass

  def lay_out(self, gen, placed):
    from jaxcap.train.rollouts.round import Round

    return Round(gen.batch, placed, _Rollouts(), None, None, None, judging=gen.judging)


class _Rollouts:
  host_lengths = np.zeros(1)


class _Rewards:
  values, valid = np.zeros((1, 1)), np.ones((1, 1), bool)


class _Sync:
  """A `WeightSync` stand-in: the published version, on a one-device mesh (the rollout thread's)."""

  def __init__(self):
    self.mesh = rollout_mesh(jax.devices()[:1])

  def publish(self, params):
    return dict(params)


@pytest.mark.parametrize("thread", [False, True], ids=["colocated", "rollout_thread"])
def test_the_version_rule_holds_whatever_the_timing(thread):
  """9 steps, checkpoints every 4, k = 2: each round is rolled out by the version the rule names (on the loop's
  thread colocated, on the rollout thread otherwise, with random delays), judged in round order, and each step
  trains on its own batch with the staleness the rule gives."""
  steps, every, k = 9, 4, 2
  source, schedule = _Source(delays=thread), FullyAsync(steps, every, k, _Sync() if thread else None)
  loader = schedule.attach(_Loader())
  staleness = []
  for step in range(steps):
    batch = next(loader)
    state = type("State", (), {"params": {"version": step}, "key": jax.random.key(0)})
    judged = schedule.round(source, state, batch, step, jax.random.key(step))
    assert judged.batch == [step]  # the loader's batch of this step
    judged.rewards()
    staleness.append(judged.metrics["async/staleness"])
    if (step + 1) % every == 0:
      assert loader.get_state() == {"next_index": step + 1}  # nothing drawn ahead across a checkpoint
  loader.close()
  assert source.made == {r: rollout_version(r, r - r % every, k) for r in range(steps)}
  assert source.submitted == list(range(steps))
  assert staleness == [0.0, 1.0, 2.0, 2.0] * 2 + [0.0]
  assert (threading.current_thread().name not in source.threads) == thread


class _Adapted(nnx.Module):
  def __init__(self):
    self.kernel = nnx.Param(jnp.ones((8, 8), jnp.float32))
    self.kernel_lora_a = nnx.LoRAParam(jnp.full((8, 2), 0.5, jnp.float32))
    self.kernel_lora_b = nnx.LoRAParam(jnp.zeros((2, 8), jnp.float32))


def test_weights_reach_the_rollout_devices_without_a_host_copy_and_lora_moves_only_adapters():
  train, rollout = split_devices(2)
  assert len(rollout) == 2 and not set(train) & set(rollout) and len(train) + 2 == len(jax.devices())
  params = nnx.split(_Adapted())[1]
  sync = WeightSync(rollout_mesh(rollout), jnp.bfloat16, adapters_only=True)
  with jax.transfer_guard_device_to_host("disallow"), jax.transfer_guard_host_to_device("disallow"):
    first = sync.publish(params)
    moved = sync.moved_bytes
    second = sync.publish(params)
  assert moved == (64 + 16 + 16) * 2  # every leaf once, in bfloat16
  assert sync.moved_bytes - moved == 32 * 2  # then the adapters only
  assert second["kernel"].value is first["kernel"].value  # the base copy reused
  for leaf in jax.tree.leaves(second):
    assert leaf.dtype == jnp.bfloat16 and leaf.sharding.device_set == set(rollout)
    assert leaf.sharding.is_fully_replicated
  with pytest.raises(ValueError, match="leaves the learner no device"):
    split_devices(len(jax.devices()))


def _metrics(workdir):
  """metrics.jsonl without what depends on the timing: time/*, the rounds ready, the rollout thread's version."""
  rows = [json.loads(line) for line in (Path(workdir) / "metrics.jsonl").read_text().splitlines()]
  timed = ("time/", "async/ready", "async/version_gap", "async/learner_wait_s")
  return [{k: v for k, v in r.items() if not k.startswith(timed)} for r in rows]


def _run_flags():
  """SMALL, k = 2 through the paged engine on 2 rollout devices of 4 (few slots: groups finish at different
  segments), checkpoints every 3 steps, three in ten judgments failing (masked and counted), rollout records with
  the judge's evidence at every step."""
  from processes import SMALL, tiny_run

  settings = {
    "rl.max_staleness": 2,
    "rollout.devices": 2,
    "checkpoint.every": 3,
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

  from processes import cpu_env

  workdir = tmp_path_factory.mktemp("async_full")
  launch("caprl", *_run_flags(), "--config.rl.stream_judging=true", workdir=workdir, script=_script(), env=cpu_env(4))
  return workdir


@pytest.mark.slow  # reads the uninterrupted run (a training subprocess)
def test_async_run_logs_staleness_and_the_queued_rounds_log_prob_gap(uninterrupted):
  """The step after a checkpoint rolls out its own batch (staleness 0); the next two train on rounds the rollout
  devices rolled out from the window's first weights (staleness 1, 2). (That a resumed run repeats the
  uninterrupted one is the SIGKILL test below.)"""
  rows = _rl_steps(uninterrupted)
  assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
  assert [r["async/staleness"] for r in rows] == [0.0, 1.0, 2.0] * 2
  assert [r["async/queued"] for r in rows] == [2.0, 1.0, 0.0] * 2
  for r in rows:
    assert r["loss"] == r["loss"] and r["grad_norm"] > 0  # finite, a gradient
    assert "rollout_corr/kl_k3" in r and "rollout_corr/is_truncated_frac" in r
  assert any(r["judge/failed/refused"] > 0 for r in rows) and any(0 < r["judge/valid_fraction"] < 1 for r in rows)
  # a queued round was sampled by weights older than the ones its old log-probs are recomputed with: they differ
  # once the warm-up's learning rate has moved the weights (steps 5, 6: ~2e-4 nats per token here); a round rolled
  # out at its own step differs only by float rounding (~3e-8)
  diff = [abs(r["rollout_corr/log_ppl_diff"]) for r in rows]
  assert max(diff[0::3]) < 1e-6 and min(diff[4], diff[5]) > 1e-5, diff


@pytest.mark.slow  # a killed training run and its rerun, in subprocesses
def test_sigkill_then_rerun_judging_each_batch_equals_the_streamed_uninterrupted_run(uninterrupted, tmp_path):
  """SIGKILL once the RL step-3 checkpoint is on disk: steps 4-6's rounds are being rolled out on the rollout
  devices when the run dies. The queue is not saved, and needs not be: no round is queued across a checkpoint, so
  the rerun rolls them out from the checkpoint's weights as the uninterrupted run did. This run judges each batch
  after its rollout, the uninterrupted one streams groups to the judge as they finish: every metric and rollout
  record (rewards, masks of failed judgments, the judge's evidence) matches."""
  from processes import cpu_env, kill_after_checkpoint, launch, launch_command

  workdir, run, script = tmp_path / "killed", [*_run_flags(), "--config.rl.stream_judging=false"], _script()
  # global step 7 = SFT's 4 + RL's 3
  cmd = launch_command("caprl", *run, workdir=workdir, script=script)
  kill_after_checkpoint(cmd, workdir, tmp_path / "log", 7, env=cpu_env(4))
  rerun = launch("caprl", *run, workdir=workdir, script=script, env=cpu_env(4))
  assert "resumed rl" in rerun.stdout + rerun.stderr
  assert _metrics(workdir) == _metrics(uninterrupted)
  assert list(_records(workdir)) == [f"step_{s:06d}.jsonl" for s in range(1, 7)]  # no step twice, none left over
  assert _records(workdir) == _records(uninterrupted)


def _partial_flags():
  """SMALL, k = 2 with partial rollouts: each checkpoint window's rounds through one engine stream."""
  from processes import SMALL, tiny_run

  settings = {
    "rl.max_staleness": 2,
    "rl.partial_rollouts": True,
    "rl.rollout_correction.is_level": "token",
    "checkpoint.every": 3,
    "eval.every": 0,
    "rollout.engine": "paged",
    "rollout.slots": 6,
    "rollout.segment_steps": 4,
  }
  return tiny_run(settings, base=SMALL)


@pytest.fixture(scope="module")
def partial_colocated(tmp_path_factory):
  """Partial rollouts on the learner's one device, the loop driving the engine, each group judged as it finishes."""
  from processes import launch

  workdir = tmp_path_factory.mktemp("partial_colocated")
  launch("caprl", *_partial_flags(), "--config.rl.stream_judging=true", workdir=workdir, script=_script())
  return workdir


@pytest.mark.slow  # a killed training run and its rerun, in subprocesses, against another run
def test_partial_rollouts_on_their_own_device_resume_exactly_and_equal_the_colocated_run(partial_colocated, tmp_path):
  """Rounds are rolled out by the rollout thread on a device of their own (rollout.devices=1 of 2), SIGKILLed once
  the RL step-3 checkpoint is on disk and rerun, each round judged once it has finished: every metric equals the
  colocated run's, where the loop drives the engine and streams groups to the judge (where each version starts
  reads only the engine's progress, never the timing). A window's third round
  was partly sampled by the version before its own: its tokens are 1 or 2 updates stale, never more."""
  from processes import cpu_env, kill_after_checkpoint, launch, launch_command

  workdir, script = tmp_path / "killed", _script()
  cmd = launch_command("caprl", *_partial_flags(), "--config.rollout.devices=1", workdir=workdir, script=script)
  kill_after_checkpoint(cmd, workdir, tmp_path / "log", 7, env=cpu_env(2))
  rerun = launch(
    "caprl", *_partial_flags(), "--config.rollout.devices=1", workdir=workdir, script=script, env=cpu_env(2)
  )
  assert "resumed rl" in rerun.stdout + rerun.stderr
  assert _metrics(workdir) == _metrics(partial_colocated)
  rows = _rl_steps(workdir)
  assert [r["async/staleness_max"] for r in rows] == [0.0, 1.0, 2.0] * 2
  assert all(1.0 < r["async/staleness"] < 2.0 for r in rows[2::3])  # versions mixed within the round
