"""`python -m jaxcap.curate_qa`: CapRL's QA filter over a manifest.

For each question of each row, a VLM answers `rotations` times with the options rotated, once with the image
and once with the question alone; the question is kept iff accuracy with the image > --min-with and without
< --max-without (released CapRL: 4 rotations, 0.75 / 0.25). Failed judgments are left out of the accuracies
(a question whose judgments all failed is dropped and counted). Writes the manifest with only kept questions.

    python -m jaxcap.curate_qa --manifest in.jsonl --out curated.jsonl --endpoint http://127.0.0.1:8000/v1 --send-images
    python -m jaxcap.curate_qa --manifest in.jsonl --out curated.jsonl --rule-based   # synthetic world
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from typing import Protocol, Sequence

import jaxcap.world  # noqa: F401  (registers judge.kind='rule_based')
from jaxcap.world.curation import CurationConfig
from jaxcap.judges.parsing import LETTERS, ReplyParseError, parse_letter
from jaxcap.judges.protocol import MultipleChoiceReply, MultipleChoiceRequest, VisualQuestionRequest
from jaxcap.data.records import ImageRecord, MultipleChoiceQuestion


class VisualAnswerer(Protocol):
  def answer_visual_questions(self, requests: Sequence[VisualQuestionRequest]) -> list[MultipleChoiceReply]: ...


class DescriptionAnswerer:
  """Rule-based stand-in for a VLM: "the image" is the record's full description (reference caption)."""

  def __init__(self, judge, descriptions: dict[str, str]):
    self.judge = judge
    self.descriptions = descriptions

  def answer_visual_questions(self, requests: Sequence[VisualQuestionRequest]) -> list[MultipleChoiceReply]:
    return self.judge.answer_multiple_choice(
      [
        MultipleChoiceRequest(
          r.image_id, self.descriptions.get(r.image_id, "") if r.with_image else "", r.question, r.options
        )
        for r in requests
      ]
    )


@dataclasses.dataclass(frozen=True)
class QuestionVerdict:
  image_id: str
  question: MultipleChoiceQuestion
  accuracy_with: float  # NaN when every judgment failed
  accuracy_without: float
  failed_judgments: int
  kept: bool


def curate(
  answerer: VisualAnswerer, records: Sequence[ImageRecord], config: CurationConfig = CurationConfig()
) -> list[QuestionVerdict]:
  """One verdict per (record, question), all judgments of all records sent as one batch."""
  requests, slots = [], []
  for ri, record in enumerate(records):
    for qi, q in enumerate(record.questions):
      for rot in range(config.rotations):
        shift = rot % len(q.options)
        options = q.options[shift:] + q.options[:shift]
        gold = LETTERS[options.index(q.answer)]
        for with_image in (True, False):
          requests.append(VisualQuestionRequest(record.id, q.question, options, with_image))
          slots.append((ri, qi, with_image, gold))
  replies = answerer.answer_visual_questions(requests) if requests else []
  tallies: dict[tuple[int, int], dict] = {}
  for (ri, qi, with_image, gold), request, reply in zip(slots, requests, replies):
    t = tallies.setdefault((ri, qi), {True: [0, 0], False: [0, 0], "failed": 0})
    if reply.failed:
      t["failed"] += 1
      continue
    try:
      letter = parse_letter(reply.reply, request.options)
    except ReplyParseError:
      t["failed"] += 1
      continue
    t[with_image][0] += letter == gold
    t[with_image][1] += 1
  verdicts = []
  for ri, record in enumerate(records):
    for qi, q in enumerate(record.questions):
      t = tallies[(ri, qi)]
      acc_with = t[True][0] / t[True][1] if t[True][1] else math.nan
      acc_without = t[False][0] / t[False][1] if t[False][1] else math.nan
      kept = acc_with > config.min_with and acc_without < config.max_without  # NaN -> False
      verdicts.append(QuestionVerdict(record.id, q, acc_with, acc_without, t["failed"], kept))
  return verdicts


def main(argv: list[str] | None = None) -> int:
  from jaxcap.data.manifest import read_manifest
  from jaxcap.judges.cli_options import add_judge_arguments, add_manifest_arguments, judge_from_args, manifest_options

  parser = argparse.ArgumentParser(
    prog="python -m jaxcap.curate_qa", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--manifest", required=True)
  parser.add_argument("--out", required=True, help="curated manifest (JSONL) to write")
  parser.add_argument("--rotations", type=int, default=4)
  parser.add_argument("--min-with", type=float, default=0.75)
  parser.add_argument("--max-without", type=float, default=0.25)
  parser.add_argument("--batch-images", type=int, default=64, help="images judged per batch")
  add_manifest_arguments(parser)
  add_judge_arguments(parser)
  args = parser.parse_args(argv)
  config = CurationConfig(rotations=args.rotations, min_with=args.min_with, max_without=args.max_without)

  rows = [json.loads(line) for line in open(args.manifest) if line.strip()]
  records = read_manifest(
    args.manifest, require_media=False, **manifest_options(args)
  ).records  # media paths resolved; rows kept verbatim
  kept_total = failed_total = asked_total = 0
  with judge_from_args(args, args.manifest, records) as judge, open(args.out, "w") as out:
    answerer = (
      judge
      if hasattr(judge, "answer_visual_questions")
      else DescriptionAnswerer(judge, {r.id: r.reference_caption for r in records})
    )
    for start in range(0, len(records), args.batch_images):
      chunk = records[start : start + args.batch_images]
      verdicts = curate(answerer, chunk, config)
      kept_ids = {(v.image_id, v.question.id) for v in verdicts if v.kept}
      for row, record in zip(rows[start : start + args.batch_images], chunk):
        row["questions"] = [q.to_json() for q in record.questions if (record.id, q.id) in kept_ids]
        out.write(json.dumps(row) + "\n")
      kept_total += len(kept_ids)
      asked_total += len(verdicts)
      failed_total += sum(v.failed_judgments for v in verdicts)
  print(json.dumps({"questions": asked_total, "kept": kept_total, "failed_judgments": failed_total}))
  return 0


if __name__ == "__main__":
  sys.exit(main())
