"""An `EvalReport` rendered: Markdown tables with bootstrap intervals, the red-team table, PNG plots, and
`write_report` (report.json, report.md, plots/length_distribution.png, plots/metric_vs_length.png)."""

from __future__ import annotations

import os
import pathlib
from typing import Any, Mapping, Sequence

import numpy as np

from jaxcap.eval.redteam import ATTACKS, RedTeamRow
from jaxcap.eval.report import EvalReport
from jaxcap.eval.vqa_probe import render_probe

METRIC_TITLES = {
  "prism/mean@n": "Prism mean@n",
  "prism/best@n": "Prism best@n",
  "captionqa/full": "CaptionQA",
  "dcscore/precision": "DC precision",
  "dcscore/recall": "DC recall",
  "dcscore/f1": "DCScore",
  "caparena/score": "CapArena",
  "caparena/win_rate": "CapArena win %",
  "bcapscore": "b-CapScore",
  "length/words": "words",
}


# ---- Markdown ---------------------------------------------------------------------------------------------


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
  return [
    "| " + " | ".join(header) + " |",
    "|" + "|".join("---" for _ in header) + "|",
    *("| " + " | ".join(r) + " |" for r in rows),
  ]


def _title(metric: str) -> str:
  if metric in METRIC_TITLES:
    return METRIC_TITLES[metric]
  if metric.startswith("captionqa/w"):
    return f"CaptionQA@{metric[len('captionqa/w') :]}w"
  return metric


def _metric_table(report: EvalReport, metrics: Sequence[str], title=_title) -> list[str]:
  rows = [[m.name, *(m.estimates[k].format() if k in m.estimates else "n/a" for k in metrics)] for m in report.models]
  return _table(["captioner", *map(title, metrics)], rows)


def _grouped(report: EvalReport, prefix: str, suffix: str = "") -> list[str]:
  names = {k for m in report.models for k in m.estimates if k.startswith(prefix) and k.endswith(suffix)}
  return sorted(k for k in names if k.count("/") >= 2)


def _subset(settings: Mapping[str, Any], n: int) -> str:
  """ " (the first n of the manifest's m)" when only part of the manifest was evaluated; the scores say so."""
  m = settings.get("manifest_images")
  out = f" (the first {n} of the manifest's {m})" if m and m > n else ""
  scored = settings.get("empty_captions_scored")
  return out + (f" · empty captions scored as written: {scored}" if scored else "")


def render_markdown(report: EvalReport, plots: Mapping[str, str] = {}) -> str:
  """The report as Markdown; `plots` maps a caption to an image path relative to the Markdown file."""
  s = report.settings
  ci = (
    f"{100 * s.get('confidence', 0.95):.0f}% percentile bootstrap over images "
    f"({s.get('bootstrap_resamples', 0)} resamples)"
  )
  out = [
    "# jaxcap caption evaluation",
    "",
    f"Judge: `{report.judge}` · images: {len(report.image_ids)}{_subset(s, len(report.image_ids))} · intervals: {ci}.",
    "All metrics in percent; CapArena score in [-100, 100]. Failed judgments are masked and counted, "
    "never scored as 0.",
    "",
    "## Summary",
    "",
  ]
  out += _metric_table(report, [k for k in report.headline if any(k in m.estimates for m in report.models)])
  if report.differences:
    columns = [k for k in report.headline if any(k in d for d in report.differences.values())]
    rows = [
      [f"{name} - {report.compared_to}", *(d[k].format() if k in d else "n/a" for k in columns)]
      for name, d in report.differences.items()
    ]
    out += [
      "",
      f"## Difference from {report.compared_to}",
      "",
      "Paired over images (the same bootstrap resamples for both captioners); an interval that excludes 0 "
      "is a difference the images support.",
      "",
    ] + _table(["captioners", *map(_title, columns)], rows)
  for heading, prefix, suffix, note in (
    ("Prism by benchmark (mean over the n captions)", "prism/", "/mean@n", ""),
    ("Prism by benchmark (best of n captions)", "prism/", "/best@n", ""),
    (
      "CapArena by baseline",
      "caparena/",
      "",
      "Score = 100 (wins - losses) / battles; each image judged in both orders.",
    ),
  ):
    metrics = _grouped(report, prefix, suffix)
    if metrics:
      out += ["", f"## {heading}", ""] + ([note, ""] if note else []) + _metric_table(report, metrics, str)
  out += ["", "## Samples and failed judgments", ""]
  n = len(report.image_ids)
  out += _table(
    ["captioner", "captions / image", "failed judgments", "images without a value (metric: count)"],
    [
      [
        m.name,
        f"{m.samples_per_image:g}",
        ", ".join(f"{k}: {v}" for k, v in sorted(m.failures.items())) or "none",
        ", ".join(
          f"{_title(k)}: {n - m.estimates[k].count}"
          for k in report.headline
          if k in m.estimates and m.estimates[k].count < n
        )
        or "none",
      ]
      for m in report.models
    ],
  )
  if report.redteam:
    out += ["", "## Reward-hacking red team", "", render_redteam(report.redteam)]
    if report.redteam_failures:
      out += [
        "",
        "Failed judgments during the red team: "
        + ", ".join(f"{k}: {v}" for k, v in sorted(report.redteam_failures.items()))
        + ".",
      ]
  out += render_probe(report.vqa_probe)
  for caption, path in plots.items():
    out += ["", f"## {caption}", "", f"![{caption}]({path})"]
  return "\n".join(out) + "\n"


def render_redteam(rows: Sequence[RedTeamRow]) -> str:
  """Attack x reward table: attack reward minus honest reward, and how often the attack wins (bold if ever)."""
  rewards = list(dict.fromkeys(r.reward for r in rows))
  cell = {(r.reward, r.attack): r for r in rows}
  honest = ["**honest (mean reward)**", ""]
  for reward in rewards:
    first = next(r for r in rows if r.reward == reward)
    honest.append("n/a" if first.honest_mean is None else f"{first.honest_mean:.3f}")
  body = [honest]
  for attack in ATTACKS:
    words = next((r.attack_words for r in rows if r.attack == attack), 0.0)
    line = [attack, f"{words:.0f}"]
    for reward in rewards:
      r = cell.get((reward, attack))
      if r is None or r.delta is None:
        line.append("n/a")
        continue
      text = f"{r.delta:+.3f} ({100 * r.beats:.0f}%)"
      line.append(f"**{text}**" if r.beats > 0 else text)
    body.append(line)
  lines = [
    "Each cell: attack reward minus honest reward, mean over images (share of images where the attack "
    "scores higher). Bold: the attack beats the honest caption on some image.",
    "",
  ]
  return "\n".join(lines + _table(["attack", "words", *rewards], body))


# ---- plots ------------------------------------------------------------------------------------------------


def _pyplot():
  import matplotlib

  matplotlib.use("Agg")  # headless: files only
  import matplotlib.pyplot as plt

  return plt


def plot_length_distribution(report: EvalReport, path: str | os.PathLike) -> None:
  """Histogram of caption length (words) per captioner."""
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(7, 4))
  top = max([max(m.lengths, default=0) for m in report.models] + [1])
  bins = np.linspace(0, top + 1, min(40, top + 2))
  for m in report.models:
    ax.hist(m.lengths, bins=bins, histtype="step", linewidth=1.5, label=m.name)
  ax.set_xlabel("caption length (words)")
  ax.set_ylabel("images")
  ax.set_title("Caption length distribution")
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def plot_metric_vs_length(report: EvalReport, metrics: Sequence[str], path: str | os.PathLike) -> None:
  """Per-image metric value against caption length, one panel per metric, one colour per captioner."""
  plt = _pyplot()
  metrics = [k for k in metrics if k != "length/words" and any(k in m.estimates for m in report.models)]
  metrics = metrics or ["length/words"]
  cols = min(3, len(metrics))
  rows = -(-len(metrics) // cols)
  fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
  for ax, metric in zip(axes.flat, metrics):
    for m in report.models:
      if metric in m.estimates:
        ax.scatter(m.lengths, m.image_values(metric), s=12, alpha=0.7, label=m.name)
    ax.set_title(_title(metric))
    ax.set_xlabel("caption length (words)")
  for ax in list(axes.flat)[len(metrics) :]:
    ax.axis("off")
  axes.flat[0].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def write_report(report: EvalReport, out_dir: str | os.PathLike) -> dict[str, pathlib.Path]:
  """Writes report.json, report.md and plots/*.png; returns their paths by kind."""
  out = pathlib.Path(out_dir)
  (out / "plots").mkdir(parents=True, exist_ok=True)
  paths = {
    "json": out / "report.json",
    "markdown": out / "report.md",
    "length_plot": out / "plots" / "length_distribution.png",
    "metric_plot": out / "plots" / "metric_vs_length.png",
  }
  report.save(paths["json"])
  plot_length_distribution(report, paths["length_plot"])
  plot_metric_vs_length(report, [k for k in report.headline if k != "length/words"], paths["metric_plot"])
  paths["markdown"].write_text(
    render_markdown(
      report,
      {
        "Caption length distribution": "plots/length_distribution.png",
        "Metric vs caption length": "plots/metric_vs_length.png",
      },
    )
  )
  return paths
