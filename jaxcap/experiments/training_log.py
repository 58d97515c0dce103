"""What an arm's training log (`<workdir>/metrics.jsonl`) says, beside its held-out captions: Proposition 1 in the
wild, the last RL step's figures, and per-step metrics (an experiment's `step_metrics`, e.g. `rollout_corr/kl_k1`)
summarised over the RL steps and then over seeds."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Mapping, Sequence

from jaxcap.train.logs.metrics import is_number


def rl_rows(workdir: Path) -> list[dict]:
  """The RL update steps' records of a run (not its evaluation records), in order."""
  path = workdir / "metrics.jsonl"
  if not path.exists():
    return []
  rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
  return [r for r in rows if r.get("phase") == "rl" and "reward/mean" in r]


def training_extras(workdir: Path, step_metrics: Sequence[str] = ()) -> dict[str, float]:
  """From the run's metrics.jsonl: collapsed / distinct reward-vector pairs over all RL groups, the last RL step's
  train reward, length, KL and loss (`train_end/*`), and for each of `step_metrics` its mean over the RL steps that
  measured it, the largest |value| and that step count (`steps/<key>/mean`, `/max_abs`, `/count`)."""
  rl = rl_rows(workdir)
  out: dict[str, float] = {}
  distinct = sum(r.get("reward/distinct_pairs", 0.0) for r in rl)
  if distinct:
    collapsed = sum(r.get("reward/collapsed_pairs", 0.0) for r in rl)
    out.update({"collapsed_pairs": collapsed, "distinct_pairs": distinct})
    out["collapsed_pair_share"] = 100.0 * collapsed / distinct
  if rl:
    last = rl[-1]
    for k in ("reward/mean", "length/mean", "kl", "loss"):
      if isinstance(last.get(k), (int, float)):
        out[f"train_end/{k}"] = float(last[k])
  for key in step_metrics:
    values = [float(r[key]) for r in rl if is_number(r.get(key))]
    if values:
      out[f"steps/{key}/mean"] = sum(values) / len(values)
      out[f"steps/{key}/max_abs"] = max(abs(v) for v in values)
      out[f"steps/{key}/count"] = float(len(values))
  return out


def pool_step_metrics(extras: Sequence[Mapping[str, float]], step_metrics: Sequence[str]) -> dict[str, dict]:
  """Per key, over the seeds' runs: the mean over all their measured RL steps (seeds weighted by step count), the
  largest |value| of any step, the per-seed means and the step count; None where no run measured it."""
  out = {}
  for key in step_metrics:
    runs = [x for x in extras if x.get(f"steps/{key}/count")]
    if not runs:
      out[key] = None
      continue
    counts = [x[f"steps/{key}/count"] for x in runs]
    means = [x[f"steps/{key}/mean"] for x in runs]
    out[key] = {
      "mean": math.fsum(m * n for m, n in zip(means, counts)) / sum(counts),
      "max_abs": max(x[f"steps/{key}/max_abs"] for x in runs),
      "seed_means": means,
      "steps": int(sum(counts)),
    }
  return out
