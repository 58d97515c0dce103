"""Per-image records the rewards read: multiple-choice questions, rubrics, reference captions.

These are the rows of a dataset manifest (JSONL), whoever wrote it: the synthetic world or a user.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Mapping, Sequence

# RubiCap severity weights.
SEVERITY_WEIGHTS: dict[str, float] = {"critical": 3.0, "important": 2.0, "minor": 1.0}


@dataclasses.dataclass(frozen=True)
class MultipleChoiceQuestion:
  """A question with its options in canonical order; `answer` is the text of the correct option."""

  id: str
  question: str
  options: tuple[str, ...]
  answer: str
  kind: str = "generic"

  def __post_init__(self):
    if len(set(self.options)) != len(self.options):
      raise ValueError(f"Question {self.id!r} has duplicate options {self.options}; make them distinct.")
    if self.answer not in self.options:
      raise ValueError(f"Question {self.id!r}: answer {self.answer!r} is not among options {self.options}.")

  @property
  def answer_index(self) -> int:
    return self.options.index(self.answer)

  def to_json(self) -> dict[str, Any]:
    return {
      "id": self.id,
      "question": self.question,
      "options": list(self.options),
      "answer": self.answer,
      "answer_index": self.answer_index,
      "kind": self.kind,
    }

  @classmethod
  def from_json(cls, row: Mapping[str, Any]) -> "MultipleChoiceQuestion":
    options = tuple(row["options"])
    answer = row["answer"] if "answer" in row else options[int(row["answer_index"])]
    return cls(
      id=str(row["id"]), question=row["question"], options=options, answer=answer, kind=row.get("kind", "generic")
    )


@dataclasses.dataclass(frozen=True)
class Criterion:
  """One binary rubric criterion with its RubiCap severity ("critical" 3, "important" 2, "minor" 1)."""

  text: str
  severity: str = "important"
  weight: float | None = None  # defaults to SEVERITY_WEIGHTS[severity]

  def __post_init__(self):
    if self.severity not in SEVERITY_WEIGHTS:
      raise ValueError(f"Criterion severity {self.severity!r}: use one of {tuple(SEVERITY_WEIGHTS)}.")
    if self.weight is None:
      object.__setattr__(self, "weight", SEVERITY_WEIGHTS[self.severity])
    if not self.weight > 0:
      raise ValueError(f"Criterion {self.text!r} has weight {self.weight}; weights must be > 0.")

  def to_json(self) -> dict[str, Any]:
    return {"text": self.text, "severity": self.severity, "weight": self.weight}

  @classmethod
  def from_json(cls, row: Mapping[str, Any]) -> "Criterion":
    return cls(text=row["text"], severity=row.get("severity", "important"), weight=row.get("weight"))


@dataclasses.dataclass(frozen=True)
class Rubric:
  """The criteria for one image plus how they were made (so they can be re-synthesised)."""

  image_id: str
  criteria: tuple[Criterion, ...]
  consensus: tuple[str, ...] = ()  # consensus elements the failures were found against
  student_caption: str = ""  # the caption whose failures became criteria
  min_agreement: int = 3  # k of the "mentioned by at least k of n teachers" rule
  num_teachers: int = 5

  def to_json(self) -> dict[str, Any]:
    return {
      "image_id": self.image_id,
      "criteria": [c.to_json() for c in self.criteria],
      "consensus": list(self.consensus),
      "student_caption": self.student_caption,
      "min_agreement": self.min_agreement,
      "num_teachers": self.num_teachers,
    }

  @classmethod
  def from_json(cls, row: Mapping[str, Any]) -> "Rubric":
    return cls(
      image_id=str(row["image_id"]),
      criteria=tuple(Criterion.from_json(c) for c in row["criteria"]),
      consensus=tuple(row.get("consensus", ())),
      student_caption=row.get("student_caption", ""),
      min_agreement=int(row.get("min_agreement", 3)),
      num_teachers=int(row.get("num_teachers", 5)),
    )


@dataclasses.dataclass(frozen=True)
class ImageRecord:
  """Everything the rewards may need about one image (or clip). Fields a reward does not use may be empty."""

  id: str
  image: str = ""  # path of the image or video file (mp4, webm, mkv, ...), or of the first frame of a clip
  frames: tuple[str, ...] = ()  # frame paths of a clip; empty for stills and video files
  questions: tuple[MultipleChoiceQuestion, ...] = ()
  rubric: Rubric | None = None
  reference_caption: str = ""
  reference_units: tuple[str, ...] = ()  # atomic facts of the reference; derived by the judge when empty
  teacher_captions: Mapping[str, str] = dataclasses.field(default_factory=dict)
  prompt: str = ""  # this row's own user text after its media (a released verl row's); '' = the run's data.prompt

  @property
  def is_video(self) -> bool:
    """Whether the record is a clip: a video file in `image` (by its suffix) or a list of frames."""
    return bool(self.frames) or is_video_file(self.image)

  def to_json(self) -> dict[str, Any]:
    return {
      "id": self.id,
      "image": self.image,
      "frames": list(self.frames),
      "questions": [q.to_json() for q in self.questions],
      "rubric": self.rubric.to_json() if self.rubric else None,
      "reference_caption": self.reference_caption,
      "reference_units": list(self.reference_units),
      "teacher_captions": dict(self.teacher_captions),
      **({"prompt": self.prompt} if self.prompt else {}),
    }

  @classmethod
  def from_json(cls, row: Mapping[str, Any]) -> "ImageRecord":
    if "id" not in row:
      raise ValueError(f"Manifest row without an 'id' field (keys: {sorted(row)}); every row needs one.")
    image = row.get("image", "")
    if row.get("video"):  # a video file: kept in `image`, so paths resolve and are checked as images' are
      if image or row.get("frames"):
        raise ValueError(
          f"Manifest row {row['id']!r} has 'video' and also 'image' or 'frames'; give one of them per row."
        )
      image = row["video"]
    return cls(
      id=str(row["id"]),
      image=image,
      frames=tuple(row.get("frames", ())),
      questions=tuple(MultipleChoiceQuestion.from_json(q) for q in row.get("questions", ())),
      rubric=Rubric.from_json(row["rubric"]) if row.get("rubric") else None,
      reference_caption=row.get("reference_caption", ""),
      reference_units=tuple(row.get("reference_units", ())),
      teacher_captions=dict(row.get("teacher_captions", {})),
      prompt=_prompt_text(row.get("prompt")),
    )


def _prompt_text(value: Any) -> str:
  """A row's own prompt: a string, or chat messages (the user turn's text, `<image>` / `<video>` placeholders
  removed: the media come from the row's image or video, ahead of the text, as jaxcap lays out a prompt)."""
  if isinstance(value, str):
    return re.sub(r"<(?:image|video)>", "", value).strip()
  if not isinstance(value, (list, tuple)):
    return ""
  for message in value:
    if isinstance(message, Mapping) and message.get("role") == "user":
      content = message.get("content")
      if isinstance(content, (list, tuple)):
        content = " ".join(
          str(p.get("text", "")) for p in content if isinstance(p, Mapping) and p.get("type") == "text"
        )
      return _prompt_text(content) if isinstance(content, str) else ""
  return ""


def align_records(captions: Sequence[str], records: Sequence[ImageRecord]) -> list[ImageRecord]:
  """One record per caption. Accepts records per caption [B*G] or per image [B] (rollouts image-major)."""
  if len(records) == len(captions):
    return list(records)
  if records and len(captions) % len(records) == 0:
    group = len(captions) // len(records)
    return [r for r in records for _ in range(group)]
  raise ValueError(
    f"Got {len(captions)} captions and {len(records)} records: pass one record per caption, or one per "
    "image with the G rollouts of each image contiguous (captions = B*G, records = B)."
  )


# Containers `jaxcap.processing.video` decodes (with PyAV); a record's `image` with one of these is a clip.
VIDEO_SUFFIXES = frozenset(
  {".mp4", ".m4v", ".mov", ".webm", ".mkv", ".avi", ".mpg", ".mpeg", ".ts", ".flv", ".wmv", ".3gp", ".ogv"}
)


def is_video_file(path: str | os.PathLike) -> bool:
  """Whether `path` names a video container (by its suffix: mp4, webm, mkv, mov, avi, ...)."""
  return os.path.splitext(os.fspath(path))[1].lower() in VIDEO_SUFFIXES
