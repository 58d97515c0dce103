"""CapRL++'s timestamp-format reward for video captions: how well a caption anchors its events in `[mm:ss]` /
`[mm:ss - mm:ss]` brackets, as the released reward server scores it (`compute_format_reward`), no judge needed.

Over the brackets that look like timestamps (`[d{1,3}:dd]`, optionally `- d{1,3}:dd` inside), a bracket is valid when
its seconds are <= 59, its minutes <= `max_minute` and an interval's end is not before its start. With v valid of
m brackets, the valid ones' start times in the order they appear:

  validity = v / m;  coverage = min(1, v / min_brackets);  chrono = 1 if the starts never decrease else 0
  score    = 0.45 * coverage * validity + 0.25 * validity + 0.30 * chrono * validity   (0 when v = 0)

The released recipe adds it to the QA accuracy with weight 0.2 (FORMAT_REWARD_WEIGHT), for video only.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Sequence

import numpy as np

from jaxcap.data.records import ImageRecord, align_records
from jaxcap.rewards.batch import RewardBatch, make_batch
from jaxcap.rewards.families import reward_family

_BRACKET = re.compile(r"\[(\d{1,3}):(\d{2})(?:\s*-\s*(\d{1,3}):(\d{2}))?\]")


@dataclasses.dataclass(frozen=True)
class TimestampFormatConfig:
  min_brackets: int = 3  # valid brackets for full coverage (FORMAT_MIN_BRACKETS)
  max_minute: int = 599  # the largest minute a valid bracket may name
  name: str = "timestamp_format/score"

  def __post_init__(self):
    if self.min_brackets < 1 or self.max_minute < 0:
      raise ValueError(
        f"reward.timestamp_format: min_brackets={self.min_brackets} must be >= 1 and max_minute={self.max_minute} >= 0"
      )


def _start_if_valid(m: re.Match, max_minute: int) -> int | None:
  """The bracket's start in seconds, or None when it is not a valid timestamp or interval."""
  minutes, seconds = int(m[1]), int(m[2])
  if seconds > 59 or minutes > max_minute:
    return None
  start = minutes * 60 + seconds
  if m[3] is None:
    return start
  end_minutes, end_seconds = int(m[3]), int(m[4])
  if end_seconds > 59 or end_minutes > max_minute or end_minutes * 60 + end_seconds < start:
    return None
  return start


def timestamp_parts(text: str, max_minute: int = 599) -> tuple[int, list[int]]:
  """(brackets that look like timestamps, the valid ones' start times in seconds, in order of appearance)."""
  matches = list(_BRACKET.finditer(text or ""))
  starts = [_start_if_valid(m, max_minute) for m in matches]
  return len(matches), [s for s in starts if s is not None]


def timestamp_format_score(text: str, *, min_brackets: int = 3, max_minute: int = 599) -> float:
  """The released format score of one caption, in [0, 1] (module docstring)."""
  brackets, starts = timestamp_parts(text, max_minute)
  if not starts:
    return 0.0
  validity = len(starts) / brackets
  coverage = min(1.0, len(starts) / max(min_brackets, 1))
  chrono = float(all(a <= b for a, b in zip(starts, starts[1:])))
  return float(min(1.0, 0.45 * coverage * validity + 0.25 * validity + 0.30 * chrono * validity))


class TimestampFormatReward:
  """Reward [N, 1], always valid (a rule, not a judgment)."""

  def __init__(self, config: TimestampFormatConfig = TimestampFormatConfig()):
    self.config = config
    self.names = (config.name,)

  def __call__(self, captions: Sequence[str], records: Sequence[ImageRecord], *, step: int = 0) -> RewardBatch:
    records = align_records(captions, records)
    cfg = self.config
    scores, evidence = [], []
    for caption in captions:
      brackets, starts = timestamp_parts(caption, cfg.max_minute)
      scores.append(timestamp_format_score(caption, min_brackets=cfg.min_brackets, max_minute=cfg.max_minute))
      evidence.append({cfg.name: {"brackets": brackets, "valid": len(starts)}})
    values = np.asarray(scores, np.float32)[:, None]
    return make_batch(self.names, values, np.ones_like(values, bool), [1.0], captions, records, {}, evidence)


@reward_family("timestamp_format", options=TimestampFormatConfig, needs_judge=False)
def timestamp_format_reward(judge, **options) -> TimestampFormatReward:
  """CapRL++'s timestamp-format reward (video captions); needs no judge."""
  return TimestampFormatReward(TimestampFormatConfig(**options))
