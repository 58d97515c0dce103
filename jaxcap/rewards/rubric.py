"""RubiCap rubric synthesis and per-image storage.

Pipeline, per image, all through the judge protocol:
  (a) consensus: split every teacher caption into claims; keep the claims that at least k of the n teacher
      captions state (coverage check of each teacher caption against the union of claims);
  (b) failures: consensus elements the student caption does not state, plus student claims the judge finds
      wrong, plus student sentences with no visual content;
  (c) one binary criterion per failure with a severity weight (critical 3 / important 2 / minor 1).
If the student has no failures, the criteria cover all consensus elements, so the rubric is never empty
while teachers agree on anything. Rubrics are stored one JSON file per image and re-synthesisable.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Iterable, Sequence

from jaxcap.judges.protocol import (
  CaptionRequest,
  ClaimVerificationRequest,
  CoverageRequest,
  CriteriaWritingRequest,
  Judge,
)
from jaxcap.data.records import Rubric


@dataclasses.dataclass(frozen=True)
class RubricSynthesisConfig:
  min_agreement: int = 3  # k: an element is consensus when at least k teachers state it


@dataclasses.dataclass(frozen=True)
class RubricJob:
  """Inputs for one image: the committee's captions and the student caption to find failures in."""

  image_id: str
  teacher_captions: tuple[str, ...]
  student_caption: str


def jobs_from_records(records, student_captions: dict[str, str]) -> tuple[list[RubricJob], list[str]]:
  """Jobs for records with teacher captions, the student caption from `student_captions` by id (else the
  stored rubric's, else ""); and the ids skipped for having no teacher captions."""
  jobs, skipped = [], []
  for r in records:
    if not r.teacher_captions:
      skipped.append(r.id)
      continue
    student = student_captions.get(r.id, r.rubric.student_caption if r.rubric else "")
    jobs.append(RubricJob(r.id, tuple(r.teacher_captions.values()), student))
  return jobs, skipped


@dataclasses.dataclass(frozen=True)
class RubricOutcome:
  image_id: str
  rubric: Rubric | None  # None when a judge call failed; retry with synthesize_rubrics
  error: str = ""


def synthesize_rubrics(
  judge: Judge, jobs: Sequence[RubricJob], config: RubricSynthesisConfig = RubricSynthesisConfig()
) -> list[RubricOutcome]:
  """One outcome per job, in order; each judge primitive is called once per stage with the whole batch."""
  for job in jobs:
    if len(job.teacher_captions) < config.min_agreement:
      raise ValueError(
        f"Image {job.image_id!r} has {len(job.teacher_captions)} teacher captions but "
        f"min_agreement={config.min_agreement}; lower k or add teachers."
      )
  errors: dict[int, str] = {}

  # (a) candidate elements: the union of all teachers' claims.
  split_requests = [(j, CaptionRequest(job.image_id, c)) for j, job in enumerate(jobs) for c in job.teacher_captions]
  splits = judge.split_claims([r for _, r in split_requests])
  candidates: list[list[str]] = [[] for _ in jobs]
  for (j, _), split in zip(split_requests, splits):
    if split.failed:
      errors.setdefault(j, f"split_claims failed: {split.error}")
    else:
      candidates[j].extend(c for c in split.claims if c not in candidates[j])
  # ... kept when at least k teacher captions cover them.
  cover_requests = [
    (j, CoverageRequest(job.image_id, c, tuple(candidates[j])))
    for j, job in enumerate(jobs)
    if j not in errors
    for c in job.teacher_captions
  ]
  votes = [[0] * len(c) for c in candidates]
  for (j, _), coverage in zip(cover_requests, judge.match_reference_units([r for _, r in cover_requests])):
    if coverage.failed:
      errors.setdefault(j, f"match_reference_units failed: {coverage.error}")
      continue
    for u, covered in enumerate(coverage.covered):
      votes[j][u] += bool(covered)
  consensus = [tuple(u for u, v in zip(candidates[j], votes[j]) if v >= config.min_agreement) for j in range(len(jobs))]

  # (b) the student's failures.
  live = [j for j in range(len(jobs)) if j not in errors]
  missing: dict[int, tuple[str, ...]] = {}
  for j, coverage in zip(
    live,
    judge.match_reference_units(
      [CoverageRequest(jobs[j].image_id, jobs[j].student_caption, consensus[j]) for j in live]
    ),
  ):
    if coverage.failed:
      errors.setdefault(j, f"match_reference_units failed: {coverage.error}")
    else:
      missing[j] = tuple(u for u, c in zip(consensus[j], coverage.covered) if not c)
  live = [j for j in live if j not in errors]
  student_claims: dict[int, tuple[str, ...]] = {}
  for j, split in zip(
    live, judge.split_claims([CaptionRequest(jobs[j].image_id, jobs[j].student_caption) for j in live])
  ):
    if split.failed:
      errors.setdefault(j, f"split_claims failed: {split.error}")
    else:
      student_claims[j] = split.claims
  live = [j for j in live if j not in errors]
  incorrect: dict[int, tuple[str, ...]] = {}
  unpointable: dict[int, tuple[str, ...]] = {}
  for j, verdicts in zip(
    live, judge.verify_claims([ClaimVerificationRequest(jobs[j].image_id, student_claims[j]) for j in live])
  ):
    if verdicts.failed:
      errors.setdefault(j, f"verify_claims failed: {verdicts.error}")
      continue
    claims = student_claims[j]
    incorrect[j] = tuple(c for c, ok, pt in zip(claims, verdicts.correct, verdicts.pointable) if pt and not ok)
    unpointable[j] = tuple(c for c, pt in zip(claims, verdicts.pointable) if not pt)

  # (c) one criterion per failure (or per consensus element when there are none).
  live = [j for j in live if j not in errors]
  writing = []
  for j in live:
    no_failures = not (missing[j] or incorrect[j] or unpointable[j])
    writing.append(
      CriteriaWritingRequest(
        jobs[j].image_id,
        jobs[j].student_caption,
        missing=consensus[j] if no_failures else missing[j],
        incorrect=incorrect[j],
        unpointable=unpointable[j],
      )
    )
  rubrics: dict[int, Rubric] = {}
  for j, written in zip(live, judge.write_criteria(writing)):
    if written.failed:
      errors.setdefault(j, f"write_criteria failed: {written.error}")
    elif not written.criteria:
      errors.setdefault(j, "no criteria: the teachers agree on nothing; lower min_agreement")
    else:
      rubrics[j] = Rubric(
        image_id=jobs[j].image_id,
        criteria=written.criteria,
        consensus=consensus[j],
        student_caption=jobs[j].student_caption,
        min_agreement=config.min_agreement,
        num_teachers=len(jobs[j].teacher_captions),
      )
  return [RubricOutcome(job.image_id, rubrics.get(j), errors.get(j, "")) for j, job in enumerate(jobs)]


class RubricStore:
  """One `<image id>.json` per image under `directory`; JSONL export/import for manifests."""

  def __init__(self, directory: str | os.PathLike):
    self.directory = pathlib.Path(directory)
    self.directory.mkdir(parents=True, exist_ok=True)

  def path(self, image_id: str) -> pathlib.Path:
    safe = image_id.replace(os.sep, "__").replace("/", "__")
    return self.directory / f"{safe}.json"

  def __contains__(self, image_id: str) -> bool:
    return self.path(image_id).exists()

  def save(self, rubric: Rubric) -> None:
    tmp = self.path(rubric.image_id).with_suffix(".json.tmp")
    tmp.write_text(json.dumps(rubric.to_json(), indent=1))
    tmp.replace(self.path(rubric.image_id))  # atomic: a reader never sees half a rubric

  def load(self, image_id: str) -> Rubric | None:
    path = self.path(image_id)
    return Rubric.from_json(json.loads(path.read_text())) if path.exists() else None

  def synthesize(
    self,
    judge: Judge,
    jobs: Sequence[RubricJob],
    *,
    overwrite: bool = False,
    config: RubricSynthesisConfig = RubricSynthesisConfig(),
  ) -> list[RubricOutcome]:
    """Synthesises and saves rubrics for jobs not stored yet (all of them with overwrite=True)."""
    todo = [job for job in jobs if overwrite or job.image_id not in self]
    outcomes = synthesize_rubrics(judge, todo, config) if todo else []
    for outcome in outcomes:
      if outcome.rubric is not None:
        self.save(outcome.rubric)
    return outcomes

  def export_jsonl(self, path: str | os.PathLike) -> int:
    """Writes every stored rubric as one JSON line; returns the count."""
    files = sorted(self.directory.glob("*.json"))
    with open(path, "w") as f:
      for file in files:
        f.write(json.dumps(json.loads(file.read_text())) + "\n")
    return len(files)

  def import_jsonl(self, path: str | os.PathLike) -> int:
    rubrics = [Rubric.from_json(json.loads(line)) for line in open(path) if line.strip()]
    for rubric in rubrics:
      self.save(rubric)
    return len(rubrics)

  def __iter__(self) -> Iterable[Rubric]:
    for file in sorted(self.directory.glob("*.json")):
      yield Rubric.from_json(json.loads(file.read_text()))
