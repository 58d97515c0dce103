"""`python -m jaxcap.synthesize_rubrics`: RubiCap rubrics (committee captions -> rubric per image) over a manifest.

Per row it uses `teacher_captions` (the committee) and a student caption: from --student-captions (JSONL rows
{"id", "caption"}), else the row's stored rubric's student caption, else "" (then every consensus element
becomes a criterion). Rubrics are saved one file per image under --out as soon as each chunk is done, so an
interrupted run resumes where it stopped (images already stored are skipped unless --overwrite).

    python -m jaxcap.synthesize_rubrics --manifest m.jsonl --out rubrics/ --endpoint http://127.0.0.1:8000/v1
"""

from __future__ import annotations

import argparse
import json
import sys

import jaxcap.world  # noqa: F401  (registers judge.kind='rule_based')
from jaxcap.rewards.rubric import RubricStore, RubricSynthesisConfig, jobs_from_records


def main(argv: list[str] | None = None) -> int:
  from jaxcap.data.manifest import read_manifest
  from jaxcap.judges.cli_options import add_judge_arguments, add_manifest_arguments, judge_from_args, manifest_options

  parser = argparse.ArgumentParser(
    prog="python -m jaxcap.synthesize_rubrics",
    description=__doc__,
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  parser.add_argument("--manifest", required=True)
  parser.add_argument("--out", required=True, help="rubric directory (one JSON per image)")
  parser.add_argument("--student-captions", help="JSONL of {'id', 'caption'}")
  parser.add_argument("--min-agreement", type=int, default=3, help="k: consensus = stated by >= k teachers")
  parser.add_argument("--chunk", type=int, default=32, help="images per judge batch (and per save)")
  parser.add_argument("--overwrite", action="store_true")
  add_manifest_arguments(parser)
  add_judge_arguments(parser)
  args = parser.parse_args(argv)

  records = read_manifest(args.manifest, require_media=False, **manifest_options(args)).records
  students = {}
  if args.student_captions:
    students = {str(row["id"]): row["caption"] for row in map(json.loads, open(args.student_captions))}
  jobs, skipped = jobs_from_records(records, students)
  store = RubricStore(args.out)
  todo = [j for j in jobs if args.overwrite or j.image_id not in store]
  done = failed = 0
  errors: dict[str, str] = {}
  config = RubricSynthesisConfig(min_agreement=args.min_agreement)
  with judge_from_args(args, args.manifest, records) as judge:
    for start in range(0, len(todo), args.chunk):
      for outcome in store.synthesize(judge, todo[start : start + args.chunk], overwrite=True, config=config):
        if outcome.rubric is None:
          failed += 1
          errors[outcome.image_id] = outcome.error
        else:
          done += 1
  print(
    json.dumps(
      {
        "written": done,
        "failed": failed,
        "already_stored": len(jobs) - len(todo),
        "no_teacher_captions": len(skipped),
        "errors": dict(list(errors.items())[:10]),
      }
    )
  )
  return 0 if failed == 0 else 1


if __name__ == "__main__":
  sys.exit(main())
