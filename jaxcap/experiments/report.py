"""The suite's report: Markdown (per experiment, the paper's claim beside the measured difference and its CI, then
every arm's metrics), the JSON it was made from, and one PNG per experiment (arm means with 95% CIs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

NAMES = {
  "qa": "held-out QA %",
  "precision": "precision",
  "recall": "recall",
  "linguistic": "linguistic",
  "prl_hmean": "P/R/L harmonic mean",
  "length/words": "words",
  "in_band": "in length band %",
  "captionqa/full": "CaptionQA",
  "captionqa/w100": "CaptionQA @100 words",
  "dcscore/f1": "DCScore F1",
  "caparena/score": "CapArena score vs start",
  "caparena/win_rate": "CapArena win % vs start",
  "bcapscore": "b-CapScore",
  "vqa": "VQA accuracy %",
  "hack/own/any": "own reward hacked %",
  "hack/own/padding": "own reward hacked by padding %",
}
SIGN = {"+": "a > b", "=": "a = b", "none": "(no published figure)"}


def _name(metric: str) -> str:
  if metric in NAMES:
    return NAMES[metric]
  if metric.startswith("hack/"):
    _, reward, kind = metric.split("/")
    return f"{reward} hacked{' by padding' if kind == 'padding' else ''} %"
  return metric


def _fmt(e: Mapping | None, digits: int = 1) -> str:
  if not e or e.get("mean") is None:
    return "n/a"
  if e.get("low") is None:
    return f"{e['mean']:.{digits}f}"
  return f"{e['mean']:.{digits}f} [{e['low']:.{digits}f}, {e['high']:.{digits}f}]"


def _table(header, rows) -> list[str]:
  return ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def render(out: Mapping[str, Any], plots: Mapping[str, str]) -> str:
  s = out["settings"]
  lines = [
    f"# Experiments suite `{out['suite']}`{' (smoke mode: few steps, not results)' if s['smoke'] else ''}",
    "",
    f"RL steps per arm: {s['rl_steps'] if not s['smoke'] else 2}; seeds {s['seeds']}; held-out images: "
    f"{s['eval_images'] if not s['smoke'] else 32}. Wall time {out['wall_s'] / 60:.1f} min "
    f"(training {out['trained_s'] / 60:.1f} min; reused from the cache: {out['reused_s'] / 60:.1f} min of training).",
    "Each arm's greedy held-out captions are pooled over seeds per image; intervals are paired bootstrap 95% CIs "
    "over images (2000 resamples), so they hold the images' sampling noise, not the seed-to-seed spread, which the "
    "per-seed columns show. A claim is 'reproduces' only when its CI excludes 0 in the paper's direction.",
    "",
    "## Claims",
    "",
  ]
  rows = []
  for name, e in out["experiments"].items():
    for c in e["claims"]:
      rows.append(
        [
          name,
          _name(c["metric"]),
          f"{c['a']} vs {c['b']}",
          f"{SIGN[c['direction']]}: {c['paper']}",
          _fmt(c["measured"], 2),
          c["verdict"],
        ]
      )
  lines += _table(["experiment", "metric", "a vs b", "paper", "measured a - b [95% CI]", "verdict"], rows)
  for name, e in out["experiments"].items():
    lines += ["", f"## {name}: {e['title']}", "", e["question"], ""]
    metrics = e["metrics"]
    header = ["arm", *[_name(m) for m in metrics]]
    rows = []
    for arm, entry in e["arms"].items():
      est = entry["estimates"]
      rows.append([arm, *[_fmt(est.get(m)) for m in metrics]])
    lines += _table(header, rows)
    seed_rows = []
    for arm, entry in e["arms"].items():
      for k, seed in enumerate(entry.get("seeds", [])):
        vals = [f"{seed['metrics'].get(m):.1f}" if seed["metrics"].get(m) is not None else "n/a" for m in metrics]
        x = seed["extras"]
        pairs = f"{x['collapsed_pairs']:.0f} / {x['distinct_pairs']:.0f}" if "distinct_pairs" in x else "-"
        seed_rows.append([f"{arm} #{k}", *vals, pairs, f"{seed['wall_s']:.0f}"])
    if seed_rows:
      lines += ["", "Per seed:", ""]
      lines += _table(["run", *[_name(m) for m in metrics], "collapsed / distinct pairs", "train s"], seed_rows)
    lines += _step_table(e)
    if name in plots:
      lines += ["", f"![{name}]({plots[name]})"]
  return "\n".join(lines) + "\n"


def _step_table(e: Mapping[str, Any]) -> list[str]:
  """The experiment's training-log step metrics per arm: mean over every RL step of every seed, then the largest
  |value| of any step; empty when it names none."""
  keys = e.get("step_metrics") or []
  rows = []
  for arm, entry in e["arms"].items():
    if "steps" in entry:
      cells = [f"{s['mean']:.3g} ({s['max_abs']:.2g})" if s else "n/a" for s in (entry["steps"][k] for k in keys)]
      rows.append([arm, *cells])
  if not rows:
    return []
  intro = "Training log, per RL step: mean over all steps and seeds (largest |value| of any step):"
  return ["", intro, "", *_table(["arm", *keys], rows)]


def plot(e: Mapping[str, Any], path: Path) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  metrics = e["metrics"]
  cols = min(3, len(metrics))
  rows = -(-len(metrics) // cols)
  fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
  arms = list(e["arms"])
  for ax, m in zip(axes.flat, metrics):
    means, lo, hi = [], [], []
    for a in arms:
      est = e["arms"][a]["estimates"].get(m) or {}
      mean = est.get("mean")
      means.append(mean if mean is not None else float("nan"))
      lo.append(mean - est["low"] if est.get("low") is not None else 0.0)
      hi.append(est["high"] - mean if est.get("high") is not None else 0.0)
    ax.bar(
      range(len(arms)), means, yerr=[lo, hi], capsize=3, color=["#999999" if a == "start" else "#4477aa" for a in arms]
    )
    ax.set_xticks(range(len(arms)), arms, rotation=30, ha="right", fontsize=8)
    ax.set_title(_name(m), fontsize=9)
  for ax in list(axes.flat)[len(metrics) :]:
    ax.axis("off")
  fig.suptitle(e["title"], fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=90)
  plt.close(fig)


def write_report(out: Mapping[str, Any], directory: Path) -> dict[str, Path]:
  directory.mkdir(parents=True, exist_ok=True)
  plots = {}
  for name, e in out["experiments"].items():
    plot(e, directory / f"{name}.png")
    plots[name] = f"{name}.png"
  (directory / "report.json").write_text(json.dumps(out, indent=1, default=float) + "\n")
  (directory / "report.md").write_text(render(out, plots))
  return {"markdown": directory / "report.md", "json": directory / "report.json"}
