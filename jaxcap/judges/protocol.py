"""The judge protocol: batched primitives that CapRL, RubiCap, BalCapRL and the Likert baselines need.

Every primitive takes a sequence of requests and returns one result per request, in order. Any result
may come back with `failed=True` (timeout, unparseable judge output, unknown image, ...); reward code masks
such results and counts them, and never reads the other fields of a failed result. Implementations: the
deterministic rule-based judge over the synthetic world (`rule_based.py`) and LLM judges over HTTP
(`http_judge.py`).
"""

from __future__ import annotations

import dataclasses
from typing import Protocol, Sequence, runtime_checkable

from jaxcap.data.records import Criterion


@dataclasses.dataclass(frozen=True)
class JudgeResult:
  """Base of every result: `failed` means "no judgment", with a human-readable `error`."""

  failed: bool = dataclasses.field(default=False, kw_only=True)
  error: str = dataclasses.field(default="", kw_only=True)


# ---- requests -------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MultipleChoiceRequest:
  """Answer `question` from `caption` alone; options are shown in this order, lettered by `labels` (one per
  option; empty: A, B, C, ...), and the reply names a label. `media`: 'image' or 'video', what the caption
  describes (an answerer may have a template per media)."""

  image_id: str
  caption: str
  question: str
  options: tuple[str, ...]
  labels: tuple[str, ...] = ()
  media: str = "image"

  def option_labels(self) -> tuple[str, ...]:
    """The label of each option: `labels`, or A, B, C, ... by position."""
    return option_labels(len(self.options), self.labels)


def option_labels(count: int, labels: Sequence[str] = ()) -> tuple[str, ...]:
  """`labels`, or the first `count` of A, B, C, ... I: the letters options are shown with."""
  return tuple(labels) or tuple("ABCDEFGHI"[:count])


@dataclasses.dataclass(frozen=True)
class CriterionRequest:
  """Does `caption` satisfy the binary `criterion`?"""

  image_id: str
  caption: str
  criterion: str


@dataclasses.dataclass(frozen=True)
class CaptionRequest:
  """A caption to split into claims or to rate for language quality."""

  image_id: str
  caption: str


@dataclasses.dataclass(frozen=True)
class ClaimVerificationRequest:
  """Check each claim against the image: is it visually correct, and could one point at it?"""

  image_id: str
  claims: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class CoverageRequest:
  """Which of the reference `units` does `caption` state?"""

  image_id: str
  caption: str
  units: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class PairwiseRequest:
  """Which caption describes the image better? `reference` optional (CapArena-style with a human caption)."""

  image_id: str
  caption_a: str
  caption_b: str
  reference: str = ""


@dataclasses.dataclass(frozen=True)
class LikertRequest:
  """Score a caption 1-10: from the image (Direct-Likert, reference None) or against `reference`."""

  image_id: str
  caption: str
  reference: str | None = None


@dataclasses.dataclass(frozen=True)
class CriteriaWritingRequest:
  """RubiCap step (c): one binary criterion per failure of the student caption, with a severity."""

  image_id: str
  student_caption: str
  missing: tuple[str, ...]  # consensus elements the student does not state
  incorrect: tuple[str, ...]  # student claims that are wrong
  unpointable: tuple[str, ...] = ()  # student sentences with no visual content (wording problems)


@dataclasses.dataclass(frozen=True)
class VisualQuestionRequest:
  """QA curation: a VLM answers `question` with the image attached (`with_image`) or from the text alone.

  Not part of `Judge` (HTTP judges implement it as `answer_visual_questions`); the rule-based stand-in is
  `jaxcap.curate_qa.DescriptionAnswerer`."""

  image_id: str
  question: str
  options: tuple[str, ...]
  with_image: bool = True


# ---- results --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MultipleChoiceReply(JudgeResult):
  """The judge's raw reply (e.g. "B"); the reward code parses the letter."""

  reply: str = ""


@dataclasses.dataclass(frozen=True)
class CriterionVerdict(JudgeResult):
  passed: bool = False


@dataclasses.dataclass(frozen=True)
class ClaimSplit(JudgeResult):
  """Atomic claims of a caption, one sentence each."""

  claims: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class ClaimVerdicts(JudgeResult):
  """Per claim: correct [len(claims)] and pointable [len(claims)]."""

  correct: tuple[bool, ...] = ()
  pointable: tuple[bool, ...] = ()


@dataclasses.dataclass(frozen=True)
class Coverage(JudgeResult):
  """Per reference unit: whether the caption states it [len(units)]."""

  covered: tuple[bool, ...] = ()


@dataclasses.dataclass(frozen=True)
class LanguageRatings(JudgeResult):
  """Clarity, fluency, coherence, each on the 1-10 scale."""

  clarity: float = 1.0
  fluency: float = 1.0
  coherence: float = 1.0


@dataclasses.dataclass(frozen=True)
class PairwiseVerdict(JudgeResult):
  winner: str = "tie"  # "a", "b" or "tie"


@dataclasses.dataclass(frozen=True)
class LikertScore(JudgeResult):
  score: float = 1.0  # 1-10


@dataclasses.dataclass(frozen=True)
class WrittenCriteria(JudgeResult):
  criteria: tuple[Criterion, ...] = ()


@runtime_checkable
class Judge(Protocol):
  """Batched judge primitives; each returns len(requests) results in request order."""

  def answer_multiple_choice(self, requests: Sequence[MultipleChoiceRequest]) -> list[MultipleChoiceReply]: ...

  def check_criteria(self, requests: Sequence[CriterionRequest]) -> list[CriterionVerdict]: ...

  def split_claims(self, requests: Sequence[CaptionRequest]) -> list[ClaimSplit]: ...

  def verify_claims(self, requests: Sequence[ClaimVerificationRequest]) -> list[ClaimVerdicts]: ...

  def match_reference_units(self, requests: Sequence[CoverageRequest]) -> list[Coverage]: ...

  def rate_language(self, requests: Sequence[CaptionRequest]) -> list[LanguageRatings]: ...

  def compare_captions(self, requests: Sequence[PairwiseRequest]) -> list[PairwiseVerdict]: ...

  def score_likert(self, requests: Sequence[LikertRequest]) -> list[LikertScore]: ...

  def write_criteria(self, requests: Sequence[CriteriaWritingRequest]) -> list[WrittenCriteria]: ...
