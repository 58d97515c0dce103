"""Rollout records: every `logging.rollouts_every` RL steps, a sample of the step's groups (the best and the worst
always among them) as one JSONL file, `<workdir>/rollouts/step_XXXXXX.jsonl` (the step as metrics.jsonl counts
it), for `python -m jaxcap.inspect` and the trackers' tables.

One line per group (strict JSON, each string cut at `logging.rollout_max_chars`, each list of evidence at
MAX_ITEMS):

    {"step": 10, "key": "step000010/g3", "record_id": "scene-17", "media": "world/train/scene-17.png",
     "prompt": "...", "reference": "the record's reference caption, or ''",
     "rank": "best" | "worst" | "sample", "group_reward": 0.62,
     "reward_names": [...], "weights": [...],
     "samples": [{"caption": "...", "reward": 0.75, "rewards": {name: value or null}, "valid": {name: bool},
                  "advantage": 0.41, "tokens": 24 (the stop token included), "words": 20,
                  "stop": "stop" | "length" (cut at sampling.max_new_tokens),
                  "evidence": {family: what its judge said}}, ...]}

`reward` is the weighted sum of the caption's rewards (null when a weighted one was not judged); `advantage` is
the step's advantage estimator over this process's groups, recomputed on the host (equal to the update's with one
process; with several, c-GDPO's batch whitening sees the global batch and this the local one; its eager ops compile
on the first recorded step, which that step's time/compiles counts). A file is written
whole and renamed into place; `resume(step)` removes the files after a restored checkpoint, so a resumed run never
holds a step twice.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from jaxcap.data.records import ImageRecord
from jaxcap.rewards.batch import RewardBatch
from jaxcap.rl import ADVANTAGE_ESTIMATORS, group_advantages

MAX_ITEMS = 64  # longest list kept in a record's evidence (CapRL questions, claims, criteria)
FILE_RE = re.compile(r"^step_(\d{6,})\.jsonl$")


def record_path(directory: Path, step: int) -> Path:
  return Path(directory) / f"step_{step:06d}.jsonl"


def recorded_steps(directory: Path) -> list[int]:
  """The steps with a rollout record file in `directory`, ascending."""
  directory = Path(directory)
  if not directory.is_dir():
    return []
  return sorted(int(m.group(1)) for p in directory.iterdir() if (m := FILE_RE.match(p.name)))


def bounded(value: Any, max_chars: int) -> Any:
  """`value` as plain JSON: every string cut to `max_chars` (a note of how much was cut), every list to MAX_ITEMS,
  numpy scalars as Python numbers and NaN / infinity as None (not measured), so `json.dumps` writes strict JSON."""
  if isinstance(value, str):
    return value if len(value) <= max_chars else value[:max_chars] + f"... [+{len(value) - max_chars} chars]"
  if isinstance(value, (float, np.floating)):
    return float(value) if math.isfinite(value) else None
  if isinstance(value, (bool, np.bool_)):
    return bool(value)
  if isinstance(value, (int, np.integer)):
    return int(value)
  if isinstance(value, dict):
    return {str(k): bounded(v, max_chars) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    kept = [bounded(v, max_chars) for v in value[:MAX_ITEMS]]
    return kept + ([f"... [+{len(value) - MAX_ITEMS} items]"] if len(value) > MAX_ITEMS else [])
  return value


def sample_rewards(rewards: RewardBatch) -> np.ndarray:
  """Each caption's weighted reward [N]: sum_k w_k v_k, NaN when a weighted dimension was not judged."""
  w = np.asarray(rewards.weights, np.float64)
  judged = np.all(rewards.valid | (w == 0)[None, :], axis=1)
  return np.where(judged, rewards.values.astype(np.float64) @ w, np.nan)


def pick_groups(group_rewards: np.ndarray, count: int) -> list[tuple[int, str]]:
  """(group index, rank) of `count` groups: the best and the worst by mean reward, then groups evenly spaced over
  the ranking between them; best first. Groups with no judged caption rank last."""
  order = [int(i) for i in np.argsort(-np.nan_to_num(group_rewards, nan=-np.inf), kind="stable")]
  if count >= len(order):
    picked = order
  else:
    middle = order[1:-1]
    spaced = np.linspace(0, len(middle) - 1, count - 2).round().astype(int) if count > 2 and middle else []
    picked = [order[0], *(middle[i] for i in dict.fromkeys(spaced)), order[-1]][: max(count, 1)]
  ranks = {order[0]: "best", order[-1]: "worst"}
  return [(i, ranks.get(i, "sample")) for i in picked]


@dataclasses.dataclass
class RolloutRecorder:
  """Writes rollout record files (see module docstring) for the steps where `wants(step)`; `sinks` get
  (step, groups) after each file (the trackers' tables). Disabled (never writes) off process 0 or with every=0."""

  directory: Path
  every: int
  groups: int
  max_chars: int
  prompt: str
  estimator: str
  stop_ids: tuple[int, ...]
  enabled: bool = True
  sinks: list[Callable[[int, list[dict]], None]] = dataclasses.field(default_factory=list)

  @classmethod
  def from_config(cls, config, workdir: Path, stop_ids: Sequence[int], enabled: bool) -> "RolloutRecorder":
    lg = config.logging
    return cls(
      Path(workdir) / "rollouts",
      int(lg.rollouts_every),
      int(lg.rollout_groups),
      int(lg.rollout_max_chars),
      str(config.data.prompt),
      str(config.rl.estimator),
      tuple(int(i) for i in stop_ids),
      enabled=enabled and int(lg.rollouts_every) > 0,
    )

  def wants(self, step: int) -> bool:
    return self.enabled and step % self.every == 0

  def resume(self, step: int) -> None:
    """Removes the files of steps after `step` (the RL step a run starts or resumes from)."""
    if not self.enabled:
      return
    for s in recorded_steps(self.directory):
      if s > step:
        record_path(self.directory, s).unlink(missing_ok=True)

  def groups_of(
    self,
    step: int,
    records: Sequence[ImageRecord],
    captions: Sequence[str],
    rewards: RewardBatch,
    tokens: np.ndarray,
    lengths: np.ndarray,
  ) -> list[dict]:
    """The step's sampled groups as record dicts. tokens int [B*G, N] and lengths int [B*G] of this process's
    rollouts (image-major, G per record); `records` one per group."""
    b = len(records)
    g = len(captions) // b
    names, r = list(rewards.names), len(rewards.names)
    per_sample = sample_rewards(rewards)
    judged = np.isfinite(per_sample).reshape(b, g)
    total = np.where(judged, per_sample.reshape(b, g), 0.0).sum(axis=1)
    group_mean = np.where(judged.any(axis=1), total / np.maximum(judged.sum(axis=1), 1), np.nan)
    adv = group_advantages(
      rewards.values.reshape(b, g, r),
      np.asarray(rewards.weights, np.float32),
      rewards.valid.reshape(b, g, r),
      estimator=self.estimator,
      **(
        {"lengths": lengths.reshape(b, g)}
        if getattr(ADVANTAGE_ESTIMATORS[self.estimator], "uses_lengths", False)
        else {}
      ),
    )
    advantages = np.where(np.asarray(adv.sample_valid), np.asarray(adv.advantages), np.nan).reshape(-1)
    out = []
    for i, rank in pick_groups(group_mean, self.groups):
      rec, samples = records[i], []
      rows = slice(i * g, (i + 1) * g)  # a caption stopped if a stop token is among its emitted tokens
      stops = np.isin(tokens[rows], self.stop_ids) & (np.arange(tokens.shape[1])[None, :] < lengths[rows, None])
      for j in range(i * g, (i + 1) * g):
        samples.append(
          {
            "caption": captions[j],
            "reward": per_sample[j],
            "rewards": {n: (float(rewards.values[j, k]) if rewards.valid[j, k] else None) for k, n in enumerate(names)},
            "valid": {n: bool(rewards.valid[j, k]) for k, n in enumerate(names)},
            "advantage": advantages[j],
            "tokens": int(lengths[j]),
            "words": int(rewards.caption_lengths[j]),
            "stop": "stop" if stops[j - i * g].any() else "length",
            "evidence": rewards.evidence[j] if rewards.evidence else {},
          }
        )
      group = {
        "step": step,
        "key": f"step{step:06d}/g{i}",
        "record_id": rec.id,
        "media": rec.frames[0] if rec.frames else rec.image,
        "prompt": rec.prompt or self.prompt,
        "reference": rec.reference_caption,
        "rank": rank,
        "group_reward": group_mean[i],
        "reward_names": names,
        "weights": [float(w) for w in rewards.weights],
        "samples": samples,
      }
      out.append(bounded(group, self.max_chars))
    return out

  def write(self, step: int, groups: list[dict]) -> Path:
    """`groups` (as `groups_of` made them: plain JSON) as the step's file, written whole then renamed into place;
    then handed to the sinks."""
    self.directory.mkdir(parents=True, exist_ok=True)
    path = record_path(self.directory, step)
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(group, allow_nan=False) + "\n" for group in groups))
    os.replace(tmp, path)
    for sink in self.sinks:
      sink(step, groups)
    return path

  def __call__(self, step: int, records, captions, rewards: RewardBatch, tokens, lengths) -> None:
    if not self.wants(step):
      return
    groups = self.groups_of(step, records, captions, rewards, np.asarray(tokens), np.asarray(lengths))
    try:
      self.write(step, groups)
    except OSError as e:  # a record is for reading the run, never its end (a full disk stops the checkpoint anyway)
      print(f"warning: rollout records of RL step {step} not written ({e})", file=sys.stderr, flush=True)
