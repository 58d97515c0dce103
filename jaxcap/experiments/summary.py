"""Per experiment, from its runs' measurements: each arm's estimates (seeds pooled per image, composites
recomputed on bootstrap replicates), per-seed points, the training-log step metrics, and each claim's a - b with a
paired bootstrap CI and its verdict against the paper's direction."""

from __future__ import annotations

from typing import Callable

import numpy as np

from jaxcap.eval.bcapscore import bcapscore_composite
from jaxcap.eval.metrics import RatioMetric, bootstrap_differences, bootstrap_estimates, harmonic_mean
from jaxcap.experiments import measure
from jaxcap.experiments.training_log import pool_step_metrics

BOOTSTRAP = dict(num_resamples=2000, confidence=0.95, seed=0)


def _same(name: str) -> Callable:
  return lambda v: np.asarray(v[name], float)


# name -> (the atomic metrics it needs, the function of their values; recomputed on bootstrap replicates).
# CapArena has one baseline here, the start, so its averages over baselines are that baseline's values.
COMPOSITES: dict[str, tuple[tuple[str, ...], Callable]] = {
  "prl_hmean": (
    ("precision", "recall", "linguistic"),
    lambda v: harmonic_mean(v["precision"], v["recall"], v["linguistic"]),
  ),
  "caparena/score": (("caparena/start/score",), _same("caparena/start/score")),
  "caparena/win_rate": (("caparena/start/win_rate",), _same("caparena/start/win_rate")),
  "bcapscore": (("dcscore/f1", "captionqa/full", "caparena/start/score"), bcapscore_composite()),
}


def _usable(metrics: dict[str, RatioMetric]) -> dict[str, Callable]:
  """The composites whose inputs were measured."""
  return {k: fn for k, (needs, fn) in COMPOSITES.items() if all(n in metrics for n in needs)}


def _estimate(e) -> dict:
  return {"mean": e.mean, "low": e.low, "high": e.high, "images": e.count}


def verdict(direction: str, low: float | None, high: float | None) -> str:
  """How the measured difference a - b (95% CI [low, high]) stands against the paper's direction."""
  if low is None or high is None:
    return "not measured"
  measured = "+" if low > 0 else "-" if high < 0 else "0"
  if direction == "none":
    return {"+": "a above b", "-": "a below b", "0": "no significant difference"}[measured]
  if direction == "+":
    return {"+": "reproduces", "-": "reversed", "0": "not significant"}[measured]
  return "reproduces" if measured == "0" else "differs"


def summarise(exp, arms, per_arm: dict[str, list], start_measured: dict, runs) -> dict:
  """Per arm: pooled estimates (seeds pooled per image) and per-seed points; per claim: a - b with a paired CI."""
  pooled = {a: measure.pool_seeds([m.metrics for m in ms]) for a, ms in per_arm.items()}
  kind = next(iter(arms.values()))["start"]
  pooled["start"] = start_measured[kind].metrics
  comps = {a: _usable(p) for a, p in pooled.items()}
  arms_out = {}
  for a, p in pooled.items():
    est = bootstrap_estimates(p, comps[a], **BOOTSTRAP)
    entry = {"estimates": {k: _estimate(v) for k, v in est.items()}}
    if a != "start":
      entry["seeds"] = [
        {
          "metrics": {
            k: v.mean for k, v in bootstrap_estimates(m.metrics, _usable(m.metrics), num_resamples=0).items()
          },
          "extras": m.extras,
          "wall_s": r.wall_s,
        }
        for m, r in zip(per_arm[a], runs[a])
      ]
      entry["config"] = arms[a]
      if exp.get("step_metrics"):
        entry["steps"] = pool_step_metrics([m.extras for m in per_arm[a]], list(exp.step_metrics))
    arms_out[a] = entry
  claims = []
  for c in exp.claims:
    a, b, metric = c["a"], c["b"], c["metric"]
    if a not in pooled or b not in pooled:
      continue  # an arm left out (smoke mode)
    shared = set(pooled[a]) & set(pooled[b])
    diffs = bootstrap_differences(
      {k: pooled[a][k] for k in shared}, {k: pooled[b][k] for k in shared}, _usable(pooled[a]), **BOOTSTRAP
    )
    d = diffs.get(metric)
    row = dict(c, measured=_estimate(d) if d else None)
    row["verdict"] = verdict(c["direction"], d.low if d else None, d.high if d else None)
    claims.append(row)
  return {
    "title": exp.title,
    "question": exp.question,
    "metrics": list(exp.metrics),
    "step_metrics": list(exp.get("step_metrics", [])),
    "arms": arms_out,
    "claims": claims,
  }
