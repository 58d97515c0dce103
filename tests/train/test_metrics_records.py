"""Issue 16 case 7 (small lies in the records): summary.json and metrics.jsonl are strict JSON (null for what was
not measured), reward/mean is not 0.0 when no judgment was valid, TensorBoard does not repeat the steps between a
checkpoint and a kill, and rerunning a finished run keeps one final evaluation."""

import json
import math
import struct
import time
import types

import numpy as np
import pytest

from jaxcap.train.logs.metrics import MetricsWriter, to_json
from jaxcap.train.logs.reward_metrics import reward_metrics


def _strict(text):
  """json.loads that rejects NaN / Infinity, as strict parsers (jq, JavaScript) do."""
  return json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c} in JSON: {text}"))


def _tensorboard_points(directory):
  """(tag, step) of every scalar in the TensorBoard event files under `directory`, in file order."""
  from tensorboardX.proto import event_pb2

  points = []
  for path in sorted((directory / "tensorboard").glob("events.out.tfevents.*")):
    data = path.read_bytes()
    i = 0
    while i < len(data):  # TFRecord framing: length u64, its crc u32, payload, payload crc u32
      (n,) = struct.unpack("<Q", data[i : i + 8])
      event = event_pb2.Event.FromString(data[i + 12 : i + 12 + n])
      points += [(v.tag, event.step) for v in event.summary.value]
      i += 12 + n + 4
  return points


def _rows(directory):
  return [_strict(line) for line in (directory / "metrics.jsonl").read_text().splitlines()]


def test_summary_json_is_strict_json():
  summary = {"rl_end": {"eval/qa_accuracy": float("nan"), "eval/reward": np.float32("inf"), "eval/length": 24.5}}
  text = to_json(summary | {"rl_end_samples": ["a red circle"], "steps": np.int64(6)})
  assert text == (
    '{"rl_end": {"eval/qa_accuracy": null, "eval/reward": null, "eval/length": 24.5}, '
    '"rl_end_samples": ["a red circle"], "steps": 6}'
  )
  _strict(text)


def test_no_valid_judgment_logs_no_reward_mean(tmp_path):
  """Every judgment failed: the mean reward is not measured, so it is NaN in memory, null in the log and absent
  from TensorBoard (it was 0.0, indistinguishable from captions that earned nothing)."""
  rewards = types.SimpleNamespace(
    names=("caprl/accuracy",),
    values=np.zeros((4, 1), np.float32),
    valid=np.zeros((4, 1), bool),
    weights=np.ones(1, np.float32),
    caption_lengths=np.full(4, 12.0),
    failed_judgments={"auth": 4},
  )
  metrics = reward_metrics(rewards)
  assert math.isnan(metrics["reward/mean"]) and math.isnan(metrics["reward/caprl/accuracy"])
  writer = MetricsWriter(tmp_path)
  writer.write("rl", 1, metrics)
  writer.close()
  assert _rows(tmp_path) == [
    {
      "phase": "rl",
      "step": 1,
      "reward/mean": None,
      "length/words": 12.0,
      "judge/failed": 4.0,
      "reward/caprl/accuracy": None,
    }
  ]
  assert sorted(_tensorboard_points(tmp_path)) == [("rl/judge/failed", 1), ("rl/length/words", 1)]


def test_tensorboard_does_not_repeat_the_steps_before_a_kill(tmp_path):
  killed = MetricsWriter(tmp_path)
  for step in range(1, 6):  # checkpoint at step 3, killed after logging step 5
    killed.write("rl", step, {"loss": float(step)})
  killed.close()
  resumed = MetricsWriter(tmp_path)
  resumed.truncate_after("rl", 3)
  for step in range(4, 7):
    resumed.write("rl", step, {"loss": 10.0 + step})
  resumed.close()
  assert _tensorboard_points(tmp_path) == [("rl/loss", s) for s in range(1, 7)]
  expected = [(1, 1.0), (2, 2.0), (3, 3.0), (4, 14.0), (5, 15.0), (6, 16.0)]
  assert [(r["step"], r["loss"]) for r in _rows(tmp_path)] == expected
  fresh = MetricsWriter(tmp_path)  # no checkpoint: the run starts over, TensorBoard too
  fresh.reset()
  fresh.write("sft", 1, {"loss": 0.5})
  fresh.close()
  assert _tensorboard_points(tmp_path) == [("sft/loss", 1)]
  assert _rows(tmp_path) == [{"phase": "sft", "step": 1, "loss": 0.5}]


def test_rerunning_a_finished_run_keeps_one_final_eval(tmp_path):
  """The loop's order: the last step is logged, the final checkpoint saved, then the final evaluation logged. A
  rerun resumes from that checkpoint (keeping the records up to its step) and evaluates again."""
  first = MetricsWriter(tmp_path)
  for step in (1, 2):
    first.write("rl", step, {"loss": 0.1 * step})
  first.write("rl", 2, {"eval/qa_accuracy": 0.5, "eval/length": 20.0})
  first.close()
  rerun = MetricsWriter(tmp_path)
  rerun.truncate_after("rl", 2)
  rerun.write("rl", 2, {"eval/qa_accuracy": 0.5, "eval/length": 20.0})
  rerun.close()
  assert _rows(tmp_path) == [
    {"phase": "rl", "step": 1, "loss": 0.1},
    {"phase": "rl", "step": 2, "loss": 0.2},
    {"phase": "rl", "step": 2, "eval/qa_accuracy": 0.5, "eval/length": 20.0},
  ]
  assert sorted(_tensorboard_points(tmp_path)) == [
    ("rl/eval/length", 2),
    ("rl/eval/qa_accuracy", 2),
    ("rl/loss", 1),
    ("rl/loss", 2),
  ]


def test_each_record_holds_its_own_steps_update_and_time(tmp_path):
  """StepLog writes step s's record one step late (after step s+1 is dispatched) but with step s's own values: its
  loss and time/update_s, the device time of its own update (`DeviceTimer`, measured by a thread, so nothing waits
  for it). Step 2's update is the slow one, and its record says so."""
  import jax
  import jax.numpy as jnp

  from jaxcap.train.logs.metrics import DeviceTimer, PendingMetrics, StepLog

  @jax.jit
  def update(x, repeats):
    y = jax.lax.fori_loop(0, repeats, lambda i, y: jnp.tanh(y @ y) / 100, x)
    return {"loss": jnp.mean(y) * 0 + repeats}

  x = jnp.ones((600, 600), jnp.float32)
  update(x, 1)["loss"].block_until_ready()  # compiled: the timed calls run it only
  writer = MetricsWriter(tmp_path)
  log = StepLog(writer, "rl", 2, 0, enabled=False)
  for step, repeats in enumerate((1, 60)):
    t0 = time.perf_counter()
    metrics = update(x, repeats)
    log.defer(step, PendingMetrics(metrics, {}, {"time/update_s": DeviceTimer(t0, metrics)}), t0)
  log.close()
  writer.close()
  rows = _rows(tmp_path)
  assert [(r["step"], r["loss"]) for r in rows] == [(1, 1.0), (2, 60.0)]
  fast, slow = (r["time/update_s"] for r in rows)
  assert 0 <= fast < slow and slow > 0.05, rows


@pytest.mark.slow  # the trainer in a subprocess
def test_a_run_logs_each_steps_time_split(tmp_path):
  """metrics.jsonl splits every RL step's time: the rollout (until its captions are on the host, less the previous
  update's tail), the judge's wait, the log-prob passes and the update (its own, on the device); SFT logs its
  update. The last step's update is in the last record."""
  from processes import launch, tiny_run

  launch("caprl", *tiny_run({"rl.steps": 3, "eval.num_images": 0}), workdir=tmp_path)
  rows = [r for r in _rows(tmp_path) if "loss" in r]
  sft, rl = [r for r in rows if r["phase"] == "sft"], [r for r in rows if r["phase"] == "rl"]
  assert [r["step"] for r in rl] == [1, 2, 3] and len(sft) == 2
  split = ("time/rollout_s", "time/judge_wait_s", "time/logprobs_s", "time/update_s", "time/step_s")
  for r in rl:
    assert all(isinstance(r[k], float) and 0 <= r[k] for k in split), r
    assert r["time/rollout_s"] + r["time/judge_wait_s"] <= r["time/step_s"], r
  assert all(isinstance(r["time/update_s"], float) and r["time/update_s"] >= 0 for r in sft)
