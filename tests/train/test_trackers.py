"""Experiment trackers behind MetricsWriter (jaxcap.train.logs.trackers): a tracker that fails to start or to log is one
warning line and is dropped, never the run's end; the log stays complete; only process 0 opens any."""

import json

import pytest

from jaxcap.train.logs import trackers as T
from jaxcap.train.logs.metrics import MetricsWriter
from jaxcap.train.logs.rollout_tables import COLUMNS, evidence_text


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
    ("rollouts", 2, ([*COLUMNS, "a"], [[2, "r0", "best", 0, "img/r0.png", "Describe.", "A cat.", "a cat", 1.0, 0.5, 4,
                                        "stop", EVIDENCE_TEXT, 1.0]])),
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


def test_tracker_keys_name_the_phase_once():
  assert T.tracker_key("vision", "vision/colour_acc") == "vision/colour_acc"  # not vision/vision/colour_acc
  assert T.tracker_key("rl", "reward/mean") == "rl/reward/mean" and T.tracker_key("rl", "loss") == "rl/loss"
  assert T.tracker_key("sft", "eval/qa_accuracy") == "sft/eval/qa_accuracy"


def test_mlflow_keys_keep_nested_names_apart_in_a_file_store():
  assert T.mlflow_key("rl", "judge/failed/auth") == "rl/judge/failed/auth"  # a database keeps the names as they are
  assert T.mlflow_key("rl", "judge/failed", file_store=True) == "rl/judge.failed"
  assert T.mlflow_key("rl", "judge/failed/auth", file_store=True) == "rl/judge.failed.auth"
  assert T.mlflow_key("vision", "vision/size_acc", file_store=True) == "vision/size_acc"
  assert T.mlflow_key("eval", "x(y)") == "eval/x_y_"


def test_the_evidence_text_names_each_option_and_verdict():
  text = evidence_text(
    {
      "caprl/accuracy": {"questions": [
        {"question": "Colour?", "options": ["red", "blue", "n/a"], "labels": ["A", "B", "F"], "gold": "B",
         "letter": "F", "correct": False},
        {"question": "Count?", "options": ["1", "2"], "gold": "A", "letter": "A", "correct": True},  # no labels: A, B
        {"question": "Shape?", "options": ["a", "b"], "gold": "A", "failed": True}]},
      "rubicap/pass_rate": {"criteria": [{"criterion": "Names the cat.", "weight": 3.0, "passed": True}]},
      "balcaprl": {"claims": [{"claim": "A dog.", "correct": True, "pointable": False}],
                   "units": [{"unit": "A cat.", "covered": False}], "language": {"clarity": 9}},
      "length_mask": {"words": 3, "reference_words": 10, "in_band": False, "dims": ["balcaprl/linguistic"]},
    }
  )  # fmt: skip
  assert text.splitlines() == [
    "[caprl/accuracy]",
    "✗ Colour? answered F. n/a, gold B. blue",
    "✓ Count? answered A. 1, gold A. 1",
    "— Shape? answered judge failed, gold A. a",
    "[rubicap/pass_rate]",
    "✓ (weight 3.0) Names the cat.",
    "[balcaprl]",
    "✗ claim: A dog. (not pointable)",
    "✗ unit: A cat.",
    "language: clarity 9",
    "[length_mask]",
    "3 words / 10 reference words: outside the band: balcaprl/linguistic set to 0",
  ]


EVIDENCE = {"a": {"questions": [{"question": "Animal?", "options": ["cat", "dog"], "gold": "A", "letter": "A",
                                 "correct": True}]}}  # fmt: skip
EVIDENCE_TEXT = "[a]\n✓ Animal? answered A. cat, gold A. cat"


def _group():
  sample = {"caption": "a cat", "reward": 1.0, "advantage": 0.5, "tokens": 4, "stop": "stop", "rewards": {"a": 1.0},
            "evidence": EVIDENCE}  # fmt: skip
  return {"step": 2, "record_id": "r0", "rank": "best", "reward_names": ["a"], "samples": [sample],
          "media": "img/r0.png", "prompt": "Describe.", "reference": "A cat."}  # fmt: skip


def test_wandb_rollout_tables_carry_the_image_itself(tmp_path):
  class FakeWandb:
    Image = staticmethod(lambda path: ("image", path))
    Table = staticmethod(lambda columns, data: {"columns": columns, "data": data})

  class FakeRun:
    logged = []
    define_metric = staticmethod(lambda *a, **k: None)
    log = staticmethod(lambda values: FakeRun.logged.append(values))

  (tmp_path / "img").mkdir()
  (tmp_path / "img" / "r0.png").write_bytes(b"png")
  tracker = object.__new__(T.WandB)  # its wiring without a W&B run
  tracker.wandb, tracker.run, tracker.workdir, tracker._phases = FakeWandb, FakeRun, tmp_path, set()
  missing = {**_group(), "record_id": "r1", "media": "img/gone.png"}
  tracker.log_rollouts(2, [_group(), missing])
  table = FakeRun.logged[-1]["rl/rollouts"]
  image = table["columns"].index("image")
  assert [row[image] for row in table["data"]] == [("image", str(tmp_path / "img" / "r0.png")), None]
  assert FakeRun.logged[-1]["rl/step"] == 2
