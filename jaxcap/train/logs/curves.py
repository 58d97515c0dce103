"""`curves.png`: a run's key curves, RL's first, then SFT's and the vision warm-up's, each panel against its phase's
own step as
metrics.jsonl, the rollout records, the trackers and the inspector count it (from 1; held-out evaluations before
a phase's first update are at its step 0). One step convention everywhere: "RL step 20" is the 20th RL update,
whatever came before it."""

from __future__ import annotations

from pathlib import Path

from jaxcap.train.logs.metrics import is_number, read_metrics

# Per phase, the panels drawn (those logged), in order; a tuple of keys shares one panel (the time split).
# A panel needs two points: a single evaluation (SFT's end) is the first point of RL's eval panel (RL step 0).
PANELS = {
  "rl": (
    "reward/mean",
    "eval/qa_accuracy",
    "kl",
    "length/mean",
    ("time/rollout_s", "time/judge_wait_s", "time/logprobs_s", "time/update_s"),
  ),
  "sft": ("loss", "eval/qa_accuracy"),
  "vision": ("loss",),
}
COLUMNS = 4
STEP_LABEL = {"vision": "vision warm-up step", "sft": "SFT step", "rl": "RL step"}
# A panel whose values vary by less than MIN_SPAN_REL of their size (or MIN_SPAN_ABS) is drawn flat at its level,
# not autoscaled until float noise fills it (the inspector's charts do the same).
MIN_SPAN_REL, MIN_SPAN_ABS = 0.01, 1e-6


def y_limits(values: list[float]) -> tuple[float, float] | None:
  """(low, high) for a panel whose values span less than the minimum span, centred on them; None otherwise
  (matplotlib's own limits)."""
  lo, hi = min(values), max(values)
  span = max(MIN_SPAN_REL * max(abs(lo), abs(hi)), MIN_SPAN_ABS)
  if hi - lo >= span:
    return None
  mid = (lo + hi) / 2
  return mid - span / 2, mid + span / 2


def _points(rows: list[dict], phase: str, key: str) -> list[tuple[int, float]]:
  return [(r["step"], r[key]) for r in rows if r.get("phase") == phase and is_number(r.get(key))]


def plot_curves(metrics_path: str | Path, out_png: str | Path, panels: dict = PANELS) -> Path:
  """curves_figure of metrics.jsonl's records, written as a PNG."""
  import matplotlib.pyplot as plt

  fig = curves_figure(read_metrics(metrics_path), panels)
  fig.savefig(out_png, dpi=90)
  plt.close(fig)
  return Path(out_png)


def curves_figure(rows: list[dict], panels: dict = PANELS):
  """A matplotlib figure of the `panels` {phase: keys} logged at two steps or more in `rows` (metrics.jsonl's
  records), COLUMNS a row, each value vs its phase's own step."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  layout = []  # (phase, key or keys)
  for phase, keys in panels.items():
    for key in keys:
      if any(len(_points(rows, phase, sub)) > 1 for sub in ((key,) if isinstance(key, str) else key)):
        layout.append((phase, key))
  ncols = max(1, min(COLUMNS, len(layout)))
  nrows = max(1, -(-len(layout) // ncols))
  fig, axes = plt.subplots(nrows, ncols, figsize=(3.6 * ncols, 2.8 * nrows), squeeze=False)
  for n, ax in enumerate(axes.reshape(-1)):
    if n >= len(layout):
      ax.axis("off")
      continue
    (phase, key), values = layout[n], []
    for sub in (key,) if isinstance(key, str) else key:
      pts = _points(rows, phase, sub)
      if pts:
        ax.plot(*zip(*pts), marker="o" if len(pts) < 30 else None, ms=3, label=sub if isinstance(key, tuple) else None)
        values += [v for _, v in pts]
    limits = y_limits(values)
    if limits is not None:
      ax.set_ylim(*limits)
    name = {"rl": "RL", "sft": "SFT"}.get(phase, phase)
    ax.set_title(f"{name}: {key if isinstance(key, str) else 'time split (s)'}", fontsize=10)
    ax.set_xlabel(STEP_LABEL.get(phase, f"{phase} step"))
    ax.ticklabel_format(axis="y", useOffset=False)
    if isinstance(key, tuple):
      ax.legend(fontsize=7)
  fig.tight_layout()
  return fig
