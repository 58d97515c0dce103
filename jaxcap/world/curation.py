"""QA curation as CapRL does it: keep a question only if the full description answers it and nothing else does.

Each question is answered `rotations` times with its options rotated, (a) from the full scene description
and (b) from each blank/irrelevant caption (question text alone). Keep iff accuracy (a) > `min_with` and
accuracy (b) < `max_without` (released CapRL: 4 rotations, > 0.75 and < 0.25).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from jaxcap.judges.protocol import Judge, MultipleChoiceRequest
from jaxcap.data.records import MultipleChoiceQuestion

LETTERS = "ABCDEFGHI"


@dataclasses.dataclass(frozen=True)
class CurationConfig:
  rotations: int = 4
  min_with: float = 0.75  # keep only if accuracy with the description is above this
  max_without: float = 0.25  # ... and accuracy without it is below this
  blank_captions: tuple[str, ...] = ("",)  # captions standing in for "no image"


@dataclasses.dataclass(frozen=True)
class CurationVerdict:
  question: MultipleChoiceQuestion
  accuracy_with: float  # NaN if every judgment failed
  accuracy_without: float
  kept: bool


def curate_questions(
  judge: Judge,
  image_id: str,
  questions: Sequence[MultipleChoiceQuestion],
  description: str,
  config: CurationConfig = CurationConfig(),
) -> list[CurationVerdict]:
  """One verdict per question, in order; failed judgments are left out of the accuracies (all failed -> drop)."""
  requests, slots = [], []
  for qi, q in enumerate(questions):
    for rot in range(config.rotations):
      shift = rot % len(q.options)
      options = q.options[shift:] + q.options[:shift]
      gold = LETTERS[options.index(q.answer)]
      for ci, caption in enumerate((description,) + tuple(config.blank_captions)):
        requests.append(MultipleChoiceRequest(image_id, caption, q.question, options))
        slots.append((qi, ci == 0, gold))
  replies = judge.answer_multiple_choice(requests)
  tallies = [{True: [0, 0], False: [0, 0]} for _ in questions]  # with/without -> [correct, answered]
  for (qi, with_description, gold), reply in zip(slots, replies):
    if reply.failed:
      continue
    tally = tallies[qi][with_description]
    tally[0] += _first_letter(reply.reply) == gold
    tally[1] += 1
  verdicts = []
  for q, tally in zip(questions, tallies):
    acc_with = tally[True][0] / tally[True][1] if tally[True][1] else float("nan")
    acc_without = tally[False][0] / tally[False][1] if tally[False][1] else float("nan")
    kept = acc_with > config.min_with and acc_without < config.max_without  # NaN compares False: dropped
    verdicts.append(CurationVerdict(q, acc_with, acc_without, kept))
  return verdicts


def _first_letter(reply: str) -> str | None:
  for ch in reply:
    if ch in LETTERS:
      return ch
  return None
