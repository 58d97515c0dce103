"""DAPO's soft overlong punishment as a reward wrapper: one more reward dimension, `overlong` (weight 1, always
valid), holding jaxcap.rl.masks.overlong_penalty of each caption's token count, so GRPO sees s + penalty as DAPO /
verl do (for c-GDPO it is a dimension normalised like the others)."""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from jaxcap.data.records import ImageRecord
from jaxcap.rewards.batch import RewardBatch, RewardFunction
from jaxcap.rewards.stage import RewardStage
from jaxcap.rl.masks import overlong_penalty

NAME = "overlong"


class OverlongPenalty(RewardStage):
  """`inner` plus the dimension `overlong`. Token counts are `len(tokenize(caption)) + 1` (the stop token), at most
  `max_len`: the decoded caption re-tokenized, which can differ from the sampled count by a token or two where the
  tokenizer merges differently; a caption cut at max_len gets the whole penalty. The mean penalty and the share of
  captions in the buffer are reported as extras overlong/penalty, overlong/in_buffer."""

  def __init__(
    self, inner: RewardFunction, tokenize: Callable[[str], Sequence[int]], *, max_len: int, buffer: int, penalty: float
  ):
    if NAME in inner.names:
      raise ValueError(f"rl.overlong: the run already has a reward named {NAME!r}")
    overlong_penalty(np.zeros(1), max_len, buffer, penalty)  # checks the bounds now, not at the first step
    super().__init__(inner)
    self.names = (*inner.names, NAME)
    self.tokenize, self.max_len, self.buffer, self.penalty = tokenize, max_len, buffer, penalty

  def complete(
    self, batch: RewardBatch, captions: Sequence[str], records: Sequence[ImageRecord], *, step: int, opened=None
  ) -> RewardBatch:
    tokens = np.minimum([len(self.tokenize(c)) + 1 for c in captions], self.max_len)
    pen = overlong_penalty(tokens, self.max_len, self.buffer, self.penalty)
    extras = {
      **batch.extras,
      "overlong/penalty": float(pen.mean()) if len(pen) else 0.0,
      "overlong/in_buffer": float((pen < 0).mean()) if len(pen) else 0.0,
    }
    return dataclasses.replace(
      batch,
      names=self.names,
      values=np.concatenate([batch.values, pen[:, None].astype(np.float32)], axis=1),
      valid=np.concatenate([batch.valid, np.ones((len(pen), 1), bool)], axis=1),
      weights=np.concatenate([np.asarray(batch.weights, np.float32), np.ones(1, np.float32)]),
      extras=extras,
    )
