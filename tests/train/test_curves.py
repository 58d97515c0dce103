"""curves.png (jaxcap.train.logs.curves): RL's key panels first, each against its phase's own step as
metrics.jsonl counts it (not a global step), and a flat series drawn flat, not autoscaled to its float noise."""

import json

import matplotlib.pyplot as plt
import pytest

from jaxcap.train.logs.curves import curves_figure, plot_curves, y_limits


def _rows():
  rows = [{"phase": "sft", "step": s, "loss": 3.0 / s} for s in range(1, 301)]
  rows.append({"phase": "sft", "step": 300, "eval/qa_accuracy": 0.5})  # one evaluation: no SFT panel of its own
  rows.append({"phase": "rl", "step": 0, "eval/qa_accuracy": 0.5})
  for s in range(1, 21):
    rows.append({"phase": "rl", "step": s, "reward/mean": 0.5 + s / 100, "kl": 0.25 + 1e-9 * (-1) ** s,
                 "time/rollout_s": 2.0, "time/update_s": 1.0, "loss": None})  # fmt: skip
  rows.append({"phase": "rl", "step": 20, "eval/qa_accuracy": 0.6})
  return rows


def test_panels_use_each_phase_own_step_rl_first():
  fig = curves_figure(_rows())
  axes = [ax for ax in fig.axes if ax.get_title()]
  titles = [ax.get_title() for ax in axes]
  assert titles == ["RL: reward/mean", "RL: eval/qa_accuracy", "RL: kl", "RL: time split (s)", "SFT: loss"]
  by_title = dict(zip(titles, axes))
  (reward,) = by_title["RL: reward/mean"].get_lines()
  assert list(reward.get_xdata()) == list(range(1, 21))  # RL step 1..20, not 301..320
  assert by_title["RL: reward/mean"].get_xlabel() == "RL step" and by_title["SFT: loss"].get_xlabel() == "SFT step"
  (evals,) = by_title["RL: eval/qa_accuracy"].get_lines()
  assert list(evals.get_xdata()) == [0, 20]  # the evaluation before RL's first update is RL step 0
  assert [line.get_label() for line in by_title["RL: time split (s)"].get_lines()] == [
    "time/rollout_s",
    "time/update_s",
  ]
  low, high = by_title["RL: kl"].get_ylim()  # +-1e-9 of noise around 0.25: drawn flat, 1% of 0.25 high
  assert high - low == pytest.approx(0.0025) and low < 0.25 < high
  low, high = by_title["RL: reward/mean"].get_ylim()  # a real trend keeps matplotlib's limits
  assert low < 0.51 and high > 0.7 and high - low < 0.3
  plt.close(fig)


def test_y_limits_only_widen_spans_below_the_minimum():
  assert y_limits([1.0, 1.0 + 1e-9]) == pytest.approx((0.995, 1.005), abs=1e-6)
  assert y_limits([0.0, 1e-9]) == pytest.approx((-5e-7, 5e-7), abs=1e-8)  # near zero: the absolute floor
  assert y_limits([0.5, 0.6]) is None and y_limits([1e-4, 3e-4]) is None


def test_plot_curves_writes_a_png(tmp_path):
  path = tmp_path / "metrics.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in _rows()))
  out = plot_curves(path, tmp_path / "curves.png")
  assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
