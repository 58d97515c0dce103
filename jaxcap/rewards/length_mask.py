"""BalCapRL's two-sided length-conditional mask as a reward wrapper, so the trainer and evaluation see the reward
exactly as RL optimises it."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from jaxcap.data.records import ImageRecord
from jaxcap.rewards.batch import RewardBatch, RewardFunction, merge_evidence
from jaxcap.rewards.stage import RewardStage
from jaxcap.rl.masks import apply_length_mask


class LengthMaskedReward(RewardStage):
  """`inner` with the dimensions `dims` (reward names) zeroed for captions outside
  tau_low <= caption words / reference words <= tau_high. Masked-out values stay valid (the caption earned 0
  there; unlike a failed judgment). The share of captions in the band is reported as extras["length/in_band"]."""

  def __init__(self, inner: RewardFunction, dims: Sequence[str], *, tau_low: float, tau_high: float):
    unknown = [n for n in dims if n not in inner.names]
    if unknown:
      raise ValueError(f"rl.length_mask.dims {unknown} are not rewards of this run ({list(inner.names)})")
    super().__init__(inner)
    self.tau_low, self.tau_high = tau_low, tau_high
    self.dims = [inner.names.index(n) for n in dims]
    self.names_masked = list(dims)

  def complete(
    self, batch: RewardBatch, captions: Sequence[str], records: Sequence[ImageRecord], *, step: int, opened=None
  ) -> RewardBatch:
    n, r = batch.values.shape
    masked, in_range = apply_length_mask(
      batch.values.reshape(n, 1, r).astype(np.float32),
      batch.caption_lengths.reshape(n, 1),
      batch.reference_lengths.reshape(n, 1),
      self.dims,
      self.tau_low,
      self.tau_high,
    )
    extras = {**batch.extras, "length/in_band": float(np.asarray(in_range).mean())}
    inside = np.asarray(in_range).reshape(n)
    decisions = [
      {"length_mask": {"words": int(c), "reference_words": int(ref), "in_band": bool(ok), "dims": self.names_masked}}
      for c, ref, ok in zip(batch.caption_lengths, batch.reference_lengths, inside)
    ]
    evidence = merge_evidence([batch.evidence, decisions], n)
    return dataclasses.replace(batch, values=np.asarray(masked).reshape(n, r), extras=extras, evidence=evidence)
