"""Proposition 1 (BalCapRL) measured on real rollout groups: how often two captions of one group have different
reward vectors but the same weighted sum, so that GRPO (which normalises the weighted sum) gives them the same
advantage while c-GDPO (which normalises each reward first) keeps them apart."""

from __future__ import annotations

import numpy as np


def collapsed_pairs(values: np.ndarray, valid: np.ndarray, weights: np.ndarray, group_size: int, atol: float = 1e-6):
  """(collapsed, distinct): over pairs of captions within each group of `group_size` consecutive rows, the pairs
  whose reward vectors differ on a weighted dimension while their weighted sums agree within `atol`, and all pairs
  whose reward vectors differ. values, valid [B * G, R]; weights [R]. Dimensions invalid for either caption of a
  pair are left out of its comparison (a masked judgment is not a value); pairs with no shared valid weighted
  dimension are skipped."""
  values, valid = np.asarray(values, np.float64), np.asarray(valid, bool)
  weights = np.asarray(weights, np.float64)
  if values.ndim != 2 or values.shape[0] % group_size:
    raise ValueError(f"values {values.shape}: need [B * G, R] with G = {group_size} dividing the rows")
  weighted = weights != 0
  v = values.reshape(-1, group_size, values.shape[1])
  m = valid.reshape(v.shape) & weighted
  i, j = np.triu_indices(group_size, k=1)
  both = m[:, i] & m[:, j]  # [B, P, R]
  diff = np.where(both, v[:, i] - v[:, j], 0.0)
  differ = (np.abs(diff) > atol).any(-1) & both.any(-1)
  same_sum = np.abs(diff @ weights) <= atol
  return int((differ & same_sum).sum()), int(differ.sum())
