"""Command-line options that choose a judge (rule-based from a manifest, or HTTP endpoints) for the CLIs."""

from __future__ import annotations

import argparse
import contextlib
import json
from typing import Iterator

from jaxcap.judges.endpoint import Endpoint
from jaxcap.judges.fleet import JudgeFleet, RoleConfig


def add_judge_arguments(parser: argparse.ArgumentParser) -> None:
  group = parser.add_argument_group("judge")
  group.add_argument(
    "--rule-based",
    action="store_true",
    help="use the rule-based judge over the manifest's scene graphs (synthetic world)",
  )
  group.add_argument(
    "--endpoint",
    action="append",
    default=[],
    help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1 (repeat for several)",
  )
  group.add_argument("--fleet-config", help="JSON file: {role: {endpoints: [...], model: ..., ...}}")
  group.add_argument("--model", default="judge", help="model name sent to the endpoints")
  group.add_argument("--api-key-env", default=None, help="environment variable holding the API key")
  group.add_argument("--send-images", action="store_true", help="attach images (MLLM / VLM judges)")
  group.add_argument("--structured-output", default="json_schema", choices=("json_schema", "json_object", "none"))
  group.add_argument("--max-concurrency", type=int, default=16)
  group.add_argument("--timeout", type=float, default=60.0, help="seconds per request")


def fleet_from_args(args: argparse.Namespace) -> JudgeFleet:
  if args.fleet_config:
    with open(args.fleet_config) as f:
      roles = {name: RoleConfig.from_json(row) for name, row in json.load(f).items()}
    return JudgeFleet(roles)
  if not args.endpoint:
    raise SystemExit("Choose a judge: --rule-based, --endpoint URL (repeatable) or --fleet-config FILE.")
  role = RoleConfig(
    endpoints=tuple(Endpoint(u, args.api_key_env) for u in args.endpoint),
    model=args.model,
    send_images=args.send_images,
    structured_output=args.structured_output,
    max_concurrency=args.max_concurrency,
    timeout_s=args.timeout,
  )
  return JudgeFleet({"judge": role})


@contextlib.contextmanager
def judge_from_args(args: argparse.Namespace, manifest: str, records) -> Iterator[object]:
  """Yields a Judge (RuleBasedJudge or HttpJudge) and closes its fleet afterwards."""
  if args.rule_based:
    from jaxcap.data.synthetic.manifest import judge_for_manifest

    yield judge_for_manifest(manifest)[1]
    return
  import pathlib

  from jaxcap.judges.http_judge import HttpJudge, images_from_records

  with fleet_from_args(args) as fleet:
    yield HttpJudge(fleet, images=images_from_records(records, pathlib.Path(manifest).parent))
    print(json.dumps(fleet.metrics(), indent=1))
