"""Dynamic sampling's test (verl's `filter_groups`, EasyR1's `online_filtering`): which groups of G judged
captions carry a signal. A group whose valid rewards are all equal has zero advantages under every group-relative
estimator: it costs a rollout and an update for no gradient.

Host numpy only: the trainer decides on the judged rewards before the update (jaxcap.train.rollouts.refill)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

OFF, SPREAD = "off", "spread"


def kept_groups(
  values: np.ndarray,
  valid: np.ndarray,
  weights: Sequence[float],
  names: Sequence[str],
  group_size: int,
  mode: str = SPREAD,
) -> np.ndarray:
  """bool [B]: the groups whose valid rewards spread, from values float [B*G, R], valid bool [B*G, R] (group by
  group, G rows each), the reward weights [R] and dimension names [R].

  `spread`: a group is kept when some weighted dimension takes two different values among the group's samples that
  the estimators use (every weighted dimension valid, `jaxcap.rl.advantages.sample_validity`); a masked judgment is
  never read as a value, so a group with fewer than two such samples (every judgment failed) is dropped. A
  dimension's name: its values among the group's entries valid in it, weighted or not. `off`: every group."""
  values, valid = np.asarray(values, np.float64), np.asarray(valid, bool)
  rows, r = values.shape
  if rows % group_size:
    raise ValueError(f"{rows} rewards do not split into groups of {group_size}")
  if mode == OFF:
    return np.ones(rows // group_size, bool)
  values, valid = values.reshape(-1, group_size, r), valid.reshape(-1, group_size, r)
  if mode == SPREAD:
    weighted = np.asarray(weights, np.float64) != 0
    used = np.all(valid | ~weighted, axis=-1, keepdims=True) & weighted  # [B, G, R]
  elif mode in names:
    used = np.zeros_like(valid)
    k = list(names).index(mode)
    used[..., k] = valid[..., k]
  else:
    raise ValueError(
      f"rl.filter_groups={mode!r}: not a reward dimension of this run; use off, spread or one of {list(names)}"
    )
  high = np.where(used, values, -np.inf).max(axis=1)  # [B, R]
  low = np.where(used, values, np.inf).min(axis=1)
  spread = (used.sum(axis=1) >= 2) & (high > low)
  return spread.any(axis=-1)
