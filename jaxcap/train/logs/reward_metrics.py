"""The host metrics of a step's rewards: the weighted mean, each dimension's mean over its valid entries, words per
caption and failed judgments (`reward_metrics`), and `weighted_mean` (the held-out evaluation's reward too)."""

from __future__ import annotations

import numpy as np

from jaxcap.rl.collapse import collapsed_pairs


def reward_metrics(rewards, group_size: int | None = None) -> dict[str, float]:
  """reward/mean (the weighted reward, each dimension averaged over its valid entries), reward/<name> (NaN when
  no judgment of it was valid), length/words and judge/failed; with `group_size` and two or more weighted reward
  dimensions, also reward/collapsed_pairs and reward/distinct_pairs (Proposition 1 in the wild:
  jaxcap.rl.collapse)."""
  values, valid = rewards.values, rewards.valid
  out = {
    "reward/mean": weighted_mean(values, valid, rewards.weights),
    "length/words": float(rewards.caption_lengths.mean()),
    "judge/failed": float(sum(rewards.failed_judgments.values())),
  }
  if group_size and int((np.asarray(rewards.weights) != 0).sum()) >= 2:
    collapsed, distinct = collapsed_pairs(values, valid, rewards.weights, group_size)
    out.update({"reward/collapsed_pairs": float(collapsed), "reward/distinct_pairs": float(distinct)})
  for k, name in enumerate(rewards.names):
    out[f"reward/{name}"] = float(values[valid[:, k], k].mean()) if valid[:, k].any() else float("nan")
  return out


def weighted_mean(values: np.ndarray, valid: np.ndarray, weights: np.ndarray) -> float:
  """Mean over captions of the weighted reward, each dimension averaged over its valid entries only; NaN when a
  weighted dimension has no valid entry (nothing measured it, so no mean is claimed)."""
  weights, measured = np.asarray(weights), valid.any(axis=0)
  if not measured[weights != 0].all():
    return float("nan")
  means = np.array([values[valid[:, k], k].mean() if measured[k] else 0.0 for k in range(values.shape[1])])
  return float(means @ weights)
