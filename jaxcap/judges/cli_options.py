"""Command-line options that choose a judge for the CLIs; they fill the same judge config as the trainer's
(`jaxcap.judges.settings.JudgeConfig`) and go through the same factory."""

from __future__ import annotations

import argparse
import contextlib
from typing import Iterator

from jaxcap.judges.factory import JUDGE_KINDS, build_judge, opened_judge
from jaxcap.judges.settings import JudgeConfig


def add_judge_arguments(parser: argparse.ArgumentParser) -> None:
  group = parser.add_argument_group("judge", f"judge kinds: {', '.join(JUDGE_KINDS)} (jaxcap.judges.factory)")
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
  group.add_argument("--factory", help="package.module:function returning a Judge")
  group.add_argument("--model", default="judge", help="model name sent to the endpoints")
  group.add_argument("--api-key-env", default=None, help="environment variable holding the API key")
  group.add_argument("--send-images", action="store_true", help="attach images (MLLM / VLM judges)")
  group.add_argument("--structured-output", default="json_schema", choices=("json_schema", "json_object", "none"))
  group.add_argument("--max-concurrency", type=int, default=16)
  group.add_argument("--timeout", type=float, default=60.0, help="seconds per request")


MANIFEST_FLAGS = ("--media-root", "--allow-outside-paths")


def add_manifest_arguments(parser: argparse.ArgumentParser) -> None:
  """The data root of --manifest's media (`jaxcap.data.media_root`)."""
  parser.add_argument(
    MANIFEST_FLAGS[0], default=None, help="folder every manifest media path must lie in (default: the manifest's)"
  )
  parser.add_argument(MANIFEST_FLAGS[1], action="store_true", help="read manifest media paths anywhere")


def manifest_options(args: argparse.Namespace) -> dict:
  """`read_manifest`'s keywords for the flags `add_manifest_arguments` adds."""
  from jaxcap.data.media_root import Flags

  flags = Flags(f"{MANIFEST_FLAGS[0]}=DIR", MANIFEST_FLAGS[1])
  return dict(media_root=args.media_root, allow_outside_paths=args.allow_outside_paths, flags=flags)


def judge_config_from_args(args: argparse.Namespace) -> JudgeConfig:
  """The judge config the flags describe."""
  if args.rule_based:
    return JudgeConfig(kind="rule_based")
  if getattr(args, "factory", None):
    return JudgeConfig(kind="factory", factory=args.factory)
  if not args.endpoint and not args.fleet_config:
    raise SystemExit("Choose a judge: --rule-based, --endpoint URL (repeatable), --fleet-config FILE or --factory.")
  return JudgeConfig(
    kind="http",
    endpoints=",".join(args.endpoint),
    fleet_config=args.fleet_config or "",
    model=args.model,
    api_key_env=args.api_key_env or "",
    send_images=args.send_images,
    structured_output=args.structured_output,
    max_concurrency=args.max_concurrency,
    timeout_s=args.timeout,
  )


@contextlib.contextmanager
def judge_from_args(args: argparse.Namespace, manifest: str, records) -> Iterator[object]:
  """Yields the judge the flags choose (over the manifest's scenes and images) and closes its fleet afterwards."""
  from jaxcap.data.manifest import read_manifest

  from jaxcap.judges.preflight import preflight_judge

  config = judge_config_from_args(args)
  # the scenes alone (the caller read the records, media confined): no media path is opened here
  scenes = (
    read_manifest(manifest, require_media=False, allow_outside_paths=True).scenes if config.kind == "rule_based" else {}
  )
  with opened_judge(build_judge(config, scenes=scenes, records=records), report=config.kind == "http") as judge:
    yield preflight_judge(judge, config, records=records)  # every endpoint answers before any work
