"""`curves.png`: a run's logged curves, one panel per key, value vs global step."""

from __future__ import annotations

from pathlib import Path

from jaxcap.train.logs.metrics import is_number, read_metrics


def plot_curves(
  metrics_path: str | Path,
  out_png: str | Path,
  keys: tuple[str, ...] = ("reward/mean", "eval/qa_accuracy", "length/mean", "eval/length"),
) -> Path:
  """A PNG with one panel per key that was logged: value vs global step (RL steps continue after SFT's)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  rows = read_metrics(metrics_path)
  present = [k for k in keys if any(k in r for r in rows)]
  offset = {"sft": 0, "rl": max((r["step"] for r in rows if r["phase"] == "sft"), default=0)}
  fig, axes = plt.subplots(1, max(1, len(present)), figsize=(4 * max(1, len(present)), 3.2), squeeze=False)
  for ax, key in zip(axes[0], present):
    for phase, style in (("sft", "--"), ("rl", "-")):
      pts = [(r["step"] + offset[phase], r[key]) for r in rows if r["phase"] == phase and is_number(r.get(key))]
      if pts:
        ax.plot(*zip(*pts), style, marker="o" if len(pts) < 30 else None, ms=3, label=phase)
    ax.set_title(key)
    ax.set_xlabel("global step")
    ax.legend()
  fig.tight_layout()
  fig.savefig(out_png, dpi=100)
  plt.close(fig)
  return Path(out_png)
