"""The named reward vector every reward function returns, and the interface they share."""

from __future__ import annotations

import collections
import dataclasses
from typing import Mapping, Protocol, Sequence

import numpy as np

from jaxcap.data.records import ImageRecord


@dataclasses.dataclass(frozen=True)
class RewardBatch:
  """Rewards for N captions (N = B*G rollouts, image-major) and R named reward dimensions.

  values: float32 [N, R]; entries where `valid` is False hold 0.0 as a placeholder only — a failed or
    impossible judgment is *masked*, never a score of 0; consumers must respect `valid`.
  valid: bool [N, R].
  weights: float32 [R], the config weights (e.g. c-GDPO's w_k) applied by the RL core, not here.
  caption_lengths / reference_lengths: int32 [N], whitespace words of the caption and of the image's
    reference caption (0 when there is none); BalCapRL's length-conditional mask uses their ratio.
  failed_judgments: judge primitive -> number of failed results during this call.
  extras: scalars a reward wrapper reports for logging, e.g. {"length/in_band": share of captions in band}.
  evidence: per caption [N], what the judge said, by reward family (JSON-able dicts: CapRL's questions and
    letters, RubiCap's verdicts, BalCapRL's claims, the length mask's decision), for rollout records; () = none.
  """

  names: tuple[str, ...]
  values: np.ndarray
  valid: np.ndarray
  weights: np.ndarray
  caption_lengths: np.ndarray
  reference_lengths: np.ndarray
  failed_judgments: Mapping[str, int] = dataclasses.field(default_factory=dict)
  extras: Mapping[str, float] = dataclasses.field(default_factory=dict)
  evidence: tuple[Mapping, ...] = ()

  def __post_init__(self):
    n, r = len(self.caption_lengths), len(self.names)
    for field, shape in (("values", (n, r)), ("valid", (n, r)), ("weights", (r,)), ("reference_lengths", (n,))):
      if np.shape(getattr(self, field)) != shape:
        raise ValueError(f"RewardBatch.{field} has shape {np.shape(getattr(self, field))}, expected {shape}.")
    if self.evidence and len(self.evidence) != n:
      raise ValueError(f"RewardBatch.evidence has {len(self.evidence)} entries, expected {n} (one per caption).")

  @property
  def masked_counts(self) -> dict[str, int]:
    """Reward name -> number of captions whose value is masked."""
    return {name: int((~self.valid[:, k]).sum()) for k, name in enumerate(self.names)}

  def column(self, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(values [N], valid [N]) of one named reward."""
    if name not in self.names:
      raise KeyError(f"No reward named {name!r}; this batch has {self.names}.")
    k = self.names.index(name)
    return self.values[:, k], self.valid[:, k]

  def metrics(self) -> dict[str, float]:
    """Scalars for logging: mean of valid values per reward, masked counts, failed judgments."""
    out = {}
    for k, name in enumerate(self.names):
      ok = self.valid[:, k]
      out[f"{name}/mean"] = float(self.values[ok, k].mean()) if ok.any() else float("nan")
      out[f"{name}/masked"] = float((~ok).sum())
    out.update({f"judge_failures/{p}": float(c) for p, c in self.failed_judgments.items()})
    return out

  @staticmethod
  def concatenate(batches: Sequence["RewardBatch"], scales: Sequence[float] | None = None) -> "RewardBatch":
    """Side by side: R = sum of the parts' R; weights multiplied by `scales` per part."""
    if not batches:
      raise ValueError("RewardBatch.concatenate needs at least one batch.")
    scales = [1.0] * len(batches) if scales is None else list(scales)
    names = tuple(n for b in batches for n in b.names)
    if len(set(names)) != len(names):
      raise ValueError(f"Duplicate reward names {names}; give each mixed component a distinct name.")
    failed: collections.Counter = collections.Counter()
    for b in batches:
      failed.update(b.failed_judgments)
    return RewardBatch(
      names=names,
      values=np.concatenate([b.values for b in batches], axis=1),
      valid=np.concatenate([b.valid for b in batches], axis=1),
      weights=np.concatenate([b.weights * s for b, s in zip(batches, scales)]).astype(np.float32),
      caption_lengths=batches[0].caption_lengths,
      reference_lengths=batches[0].reference_lengths,
      failed_judgments=dict(failed),
      evidence=merge_evidence([b.evidence for b in batches], len(batches[0].caption_lengths)),
    )


def stack_rows(parts: Sequence[RewardBatch]) -> RewardBatch:
  """The batches of consecutive captions of one reward as one: N = the parts' N summed, in order (same names and
  weights); failed judgments summed. Parts carry no extras (a mean over parts is not the whole's mean), and
  either all or none carry evidence."""
  if not parts:
    raise ValueError("stack_rows needs at least one batch.")
  head = parts[0]
  for b in parts[1:]:
    if b.names != head.names or not np.array_equal(b.weights, head.weights):
      raise ValueError(f"stack_rows: parts of different rewards ({head.names} vs {b.names}).")
  if any(b.extras for b in parts):
    raise ValueError("stack_rows: a part carries extras; stack the innermost reward's batches, before any stage")
  with_evidence = [bool(b.evidence) for b in parts]
  if any(with_evidence) and not all(with_evidence):
    raise ValueError("stack_rows: some parts carry evidence and some do not")
  failed: collections.Counter = collections.Counter()
  for b in parts:
    failed.update(b.failed_judgments)
  cat = lambda field: np.concatenate([getattr(b, field) for b in parts])
  return RewardBatch(
    names=head.names,
    values=cat("values"),
    valid=cat("valid"),
    weights=head.weights,
    caption_lengths=cat("caption_lengths"),
    reference_lengths=cat("reference_lengths"),
    failed_judgments=dict(failed),
    evidence=tuple(e for b in parts for e in b.evidence),
  )


def merge_evidence(parts: Sequence[Sequence[Mapping]], n: int) -> tuple[Mapping, ...]:
  """Per caption, the union of the parts' evidence dicts (parts without evidence skipped); () when none has any."""
  parts = [p for p in parts if p]
  if not parts:
    return ()
  return tuple({k: v for p in parts for k, v in p[i].items()} for i in range(n))


class RewardFunction(Protocol):
  """Scores captions [N] given one record per caption (or per image, rollouts contiguous). A reward whose values
  depend on a caption's place in the step's batch (CapRL's draws) also takes `first: int = 0`, the index of
  captions[0] there: streaming judging scores a batch by groups (`positioned`)."""

  names: tuple[str, ...]

  def __call__(self, captions: Sequence[str], records: Sequence[ImageRecord], *, step: int = 0) -> RewardBatch: ...


def positioned(first: int) -> dict[str, int]:
  """The keywords of a reward call for captions starting at index `first` of the step's batch: none at 0, so
  reward functions that key nothing by position need not take `first`."""
  return {"first": int(first)} if first else {}


def word_count(text: str) -> int:
  return len(text.split())


def make_batch(
  names: Sequence[str],
  values: np.ndarray,
  valid: np.ndarray,
  weights: Sequence[float],
  captions: Sequence[str],
  records: Sequence[ImageRecord],
  failed: Mapping[str, int],
  evidence: Sequence[Mapping] = (),
) -> RewardBatch:
  """Assembles a RewardBatch, zeroing masked entries and computing lengths."""
  valid = np.asarray(valid, bool)
  values = np.where(valid, np.asarray(values, np.float32), np.float32(0.0)).astype(np.float32)
  return RewardBatch(
    names=tuple(names),
    values=values,
    valid=valid,
    weights=np.asarray(weights, np.float32),
    caption_lengths=np.array([word_count(c) for c in captions], np.int32),
    reference_lengths=np.array([word_count(r.reference_caption) for r in records], np.int32),
    failed_judgments={k: int(v) for k, v in failed.items() if v},
    evidence=tuple(evidence),
  )
