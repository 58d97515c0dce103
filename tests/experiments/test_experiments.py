"""The experiments suite: every experiment file resolves to valid, distinct run configs; the statistics on
hand-computed cases; and a smoke run of the CLI (2 arms x 2 seeds, few steps) whose report has the promised
structure, whose arms differ, and whose rerun reuses the cached start and arms."""

from __future__ import annotations

import json

import numpy as np
import pytest

from processes import cli

from jaxcap.eval.metrics import RatioMetric
from jaxcap.experiments import measure
from jaxcap.experiments.runs import Settings, Start, arm_config, config_hash
from jaxcap.experiments.spec import SUITES, arm, claim, experiment, load_experiment, merge, method_config
from jaxcap.experiments.summary import verdict
from jaxcap.experiments.training_log import pool_step_metrics, training_extras
from jaxcap.config_files import validate


@pytest.mark.parametrize("name", SUITES["papers"])
def test_every_arm_resolves_to_a_valid_distinct_config(name, tmp_path):
  exp = load_experiment(name)
  settings = Settings(workdir=tmp_path, rl_steps=100)
  start = Start(tmp_path / "start", 0.0, False)
  hashes = {}
  for arm_name, a in exp.arms.items():
    c = arm_config(a.to_dict(), start, 0, settings, export=False)
    validate(c)
    assert c.model.checkpoint == str(start.export) and c.vision_warmup.steps == 0
    assert c.data.eval_manifest == str(start.heldout_manifest)
    if a.phase == "sft":  # as many sequences as the RL arm updates
      assert c.rl.steps == 0 and c.sft.steps == 100 * c.rl.batch_size * c.rl.num_samples // c.sft.batch_size
    else:
      assert c.rl.steps == 100 and c.sft.steps == 0
    hashes[arm_name] = config_hash(c)
  assert len(set(hashes.values())) == len(hashes), f"two arms of {name} are the same run: {hashes}"
  smoke = Settings(workdir=tmp_path, smoke=True)  # the smoke mode's small batches are valid for every arm too
  for a in exp.arms.values():
    c = arm_config(a.to_dict(), start, 0, smoke, export=False)
    validate(c)
    assert (c.rl.batch_size, c.rl.num_samples) == (4, 4)


def test_arms_shared_between_experiments_are_one_run(tmp_path):
  """The paper's c-GDPO arm (tau_u = 2) is one run in both BalCapRL experiments, so the suite trains it once."""
  settings, start = Settings(workdir=tmp_path), Start(tmp_path / "s", 0.0, False)
  a = load_experiment("cgdpo_vs_grpo").arms.c_gdpo.to_dict()
  b = load_experiment("length_mask").arms.tau_2.to_dict()
  assert (
    arm_config(a, start, 1, settings, export=False).workdir == arm_config(b, start, 1, settings, export=False).workdir
  )
  assert (
    arm_config(a, start, 0, settings, export=False).workdir != arm_config(a, start, 1, settings, export=False).workdir
  )


def test_overrides_merge_and_unknown_fields_are_named():
  c = method_config("balcaprl")
  merge(c, {"rl": {"length_mask": {"tau_high": 5.0}}, "reward": {"likert_direct": {"weight": 1.0}}})
  assert c.rl.length_mask.tau_high == 5.0 and c.rl.length_mask.tau_low == 0.5  # merged, not replaced
  assert list(c.reward) == ["likert_direct"]  # the reward block is replaced whole
  with pytest.raises(ValueError, match="'estimatr'"):
    merge(c, {"rl": {"estimatr": "grpo"}})
  with pytest.raises(ValueError, match="arm 'nope'"):
    experiment(title="t", question="q", arms={"a": arm()}, metrics=["qa"], claims=[claim("qa", "a", "nope", "+", "")])


@pytest.mark.parametrize(
  "direction, low, high, expected",
  [
    ("+", 0.5, 2.0, "reproduces"),
    ("+", -2.0, -0.1, "reversed"),
    ("+", -0.5, 1.0, "not significant"),
    ("=", -0.5, 1.0, "reproduces"),
    ("=", 0.2, 1.0, "differs"),
    ("none", 0.2, 1.0, "a above b"),
    ("none", None, None, "not measured"),
  ],
)
def test_verdict(direction, low, high, expected):
  assert verdict(direction, low, high) == expected


def test_pool_seeds_sums_each_image_over_seeds():
  a = {"qa": RatioMetric.from_arrays([3, 0, 1], [4, 0, 2]), "only_a": RatioMetric.per_image([1, 1, 1], [1, 1, 1])}
  b = {"qa": RatioMetric.from_arrays([1, 2, 2], [4, 4, 2])}
  pooled = measure.pool_seeds([a, b])
  assert list(pooled) == ["qa"]  # only metrics every seed measured
  np.testing.assert_allclose(pooled["qa"].image_values, [4 / 8, 2 / 4, 3 / 4])
  assert pooled["qa"].value == pytest.approx(9 / 16)


def test_step_metrics_average_the_rl_steps_then_the_seeds(tmp_path):
  """Each run: mean over its RL update records that measured the key (null and eval records skipped); over runs:
  weighted by their step counts, the largest |value| of any step."""
  rows = [
    {"phase": "sft", "step": 1, "loss": 1.0, "x": 100.0},
    {"phase": "rl", "step": 1, "reward/mean": 0.1, "x": 1.0, "loss": 0.5},
    {"phase": "rl", "step": 2, "reward/mean": 0.2, "x": -3.0, "loss": 0.4},
    {"phase": "rl", "step": 2, "eval/qa_accuracy": 0.5, "x": 50.0},  # an evaluation record
    {"phase": "rl", "step": 3, "reward/mean": 0.3, "x": None, "loss": 0.3},  # not measured
  ]
  runs = []
  for k, extra in enumerate([rows, rows[:2]]):
    (tmp_path / str(k)).mkdir()
    (tmp_path / str(k) / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in extra) + "\n")
    runs.append(training_extras(tmp_path / str(k), ["x", "y"]))
  assert runs[0]["steps/x/mean"] == -1.0 and runs[0]["steps/x/max_abs"] == 3.0 and runs[0]["steps/x/count"] == 2
  assert runs[0]["train_end/loss"] == 0.3 and "steps/y/mean" not in runs[0]
  pooled = pool_step_metrics(runs, ["x", "y"])
  assert pooled["x"] == {"mean": pytest.approx(-1 / 3), "max_abs": 3.0, "seed_means": [-1.0, 1.0], "steps": 3}
  assert pooled["y"] is None


@pytest.mark.slow
def test_smoke_run_writes_the_report_and_its_rerun_reuses_the_cache(tmp_path):
  args = ["--smoke", "--only=cgdpo_vs_grpo", f"--workdir={tmp_path}"]
  cli("experiments", *args)
  out = tmp_path / "papers_smoke_cgdpo_vs_grpo"
  report = json.loads((out / "report.json").read_text())
  md = (out / "report.md").read_text()
  assert (out / "cgdpo_vs_grpo.png").stat().st_size > 1000
  assert "## Claims" in md and "## cgdpo_vs_grpo" in md and "Per seed" in md
  e = report["experiments"]["cgdpo_vs_grpo"]
  assert set(e["arms"]) == {"c_gdpo", "grpo", "start"}
  for name in ("c_gdpo", "grpo"):
    assert len(e["arms"][name]["seeds"]) == 2
    for metric in e["metrics"]:
      assert metric in e["arms"][name]["estimates"], metric
  assert [c["metric"] for c in e["claims"]] == ["dcscore/f1", "caparena/score", "prl_hmean"]
  assert all(c["verdict"] and "measured" in c for c in e["claims"])
  # the two arms trained differently from the same start and seed: c-GDPO's advantages are not GRPO's
  loss = lambda arm, k: e["arms"][arm]["seeds"][k]["extras"]["train_end/loss"]  # noqa: E731
  assert all(loss("c_gdpo", k) != loss("grpo", k) for k in range(2))
  assert report["trained_s"] > 0
  again = cli("experiments", *args)
  assert "start caption: reused" in again.stdout
  rerun = json.loads((out / "report.json").read_text())
  assert rerun["trained_s"] == 0 and rerun["reused_s"] > 0
  assert rerun["experiments"]["cgdpo_vs_grpo"]["claims"] == e["claims"]  # the same runs, the same figures
