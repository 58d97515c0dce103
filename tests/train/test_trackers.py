"""Experiment trackers behind MetricsWriter (jaxcap.train.logs.trackers): a tracker that fails to start or to log is one
warning line and is dropped, never the run's end; the log stays complete; only process 0 opens any."""

import json

import pytest

from jaxcap.train.logs import trackers as T
from jaxcap.train.logs.metrics import MetricsWriter


class Recording:
  """A tracker that records what it is given."""

  def __init__(self, workdir, config, project, run_name, **_):
    self.calls = []
    self.config = config

  def log(self, phase, step, values):
    self.calls.append(("log", phase, step, dict(values)))

  def replace(self, rows):
    self.calls.append(("replace", len(rows)))

  def log_rollouts(self, step, groups):
    self.calls.append(("rollouts", step, T.rollout_table(groups)))

  def close(self):
    self.calls.append(("close",))


class FailsToStart:
  def __init__(self, *a, **k):
    raise ConnectionError("no route to host")


class NotInstalled:
  def __init__(self, *a, **k):
    raise ImportError("No module named 'wandb'")


class FailsToLog(Recording):
  def log(self, phase, step, values):
    raise RuntimeError("disk full")


@pytest.fixture
def registry(monkeypatch):
  monkeypatch.setitem(T.TRACKERS, "recording", Recording)
  monkeypatch.setitem(T.TRACKERS, "fails_to_start", FailsToStart)
  monkeypatch.setitem(T.TRACKERS, "fails_to_log", FailsToLog)
  monkeypatch.setitem(T.TRACKERS, "not_installed", NotInstalled)


def test_a_broken_tracker_is_a_warning_and_the_log_goes_on(tmp_path, registry, capsys):
  names = ("fails_to_start", "recording", "fails_to_log", "not_installed")
  writer = MetricsWriter(tmp_path, trackers=names, config={"seed": 0})
  err = capsys.readouterr().err
  assert "tracker 'fails_to_start' did not start (ConnectionError: no route to host)" in err
  assert "tracker 'not_installed' is not installed" in err and "jaxcap[tracking]" in err
  assert [type(t).__name__ for t in writer.trackers] == ["Recording", "FailsToLog"]
  writer.write("rl", 1, {"loss": 0.5, "reward/mean": float("nan"), "grad_norm": "inf"})
  assert "tracker FailsToLog failed (RuntimeError: disk full); dropped" in capsys.readouterr().err
  (recording,) = writer.trackers
  writer.write("rl", 2, {"loss": 0.25})
  writer.log_rollouts(2, [_group()])
  writer.truncate_after("rl", 1)
  writer.close()
  assert recording.config == {"seed": 0}
  assert recording.calls == [
    ("log", "rl", 1, {"loss": 0.5}),  # neither the unmeasured NaN nor a measured "inf" reaches a tracker
    ("log", "rl", 2, {"loss": 0.25}),
    ("rollouts", 2, (["step", "record_id", "rank", "sample", "caption", "reward", "advantage", "tokens", "stop", "a"],
                     [[2, "r0", "best", 0, "a cat", 1.0, 0.5, 4, "stop", 1.0]])),
    ("replace", 1),
    ("close",),
  ]  # fmt: skip
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert rows == [{"phase": "rl", "step": 1, "loss": 0.5, "reward/mean": None, "grad_norm": "inf"}]


def test_only_process_zero_opens_trackers(tmp_path, registry):
  writer = MetricsWriter(tmp_path, enabled=False, trackers=("recording",))
  writer.write("rl", 1, {"loss": 0.5})
  writer.log_rollouts(1, [_group()])
  assert writer.trackers == [] and not (tmp_path / "metrics.jsonl").exists()


def test_mlflow_keys_keep_nested_names_apart():
  assert T.mlflow_key("rl", "judge/failed") == "rl/judge.failed"
  assert T.mlflow_key("rl", "judge/failed/auth") == "rl/judge.failed.auth"
  assert T.mlflow_key("eval", "x(y)") == "eval/x_y_"


def _group():
  sample = {"caption": "a cat", "reward": 1.0, "advantage": 0.5, "tokens": 4, "stop": "stop", "rewards": {"a": 1.0}}
  return {"step": 2, "record_id": "r0", "rank": "best", "reward_names": ["a"], "samples": [sample]}
