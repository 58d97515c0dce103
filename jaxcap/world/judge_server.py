"""The rule-based judge behind the OpenAI-compatible server (`python -m jaxcap.judge serve --rule-based`): an
HTTP judge fleet for the synthetic world, with no LLM."""

from __future__ import annotations

from typing import Sequence

from fastapi import FastAPI

from jaxcap.data.manifest import read_manifest
from jaxcap.judges.server import DEFAULT_MAX_BODY_BYTES, DEFAULT_WORKERS, RuleBasedBackend, make_app
from jaxcap.world.judge import RuleBasedJudge


def rule_based_app_for_manifest(
  manifest: str,
  *,
  added_latency_s: float = 0.0,
  failure_rate: float = 0.0,
  seed: int = 0,
  model: str | Sequence[str] = "judge",
  api_key: str | None = None,
  max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
  workers: int = DEFAULT_WORKERS,
) -> FastAPI:
  """The app for a dataset manifest whose rows carry their scene graph (synthetic world); the keyword options
  are `make_app`'s."""
  records, scenes = read_manifest(
    manifest, require_media=False, allow_outside_paths=True
  )  # scenes, references: no media read
  if not scenes:
    raise ValueError(
      f"Manifest {manifest} has no 'scene' fields; the rule-based judge needs the synthetic "
      "world's ground truth (write it with jaxcap.world.dataset.generate_dataset)."
    )
  judge = RuleBasedJudge(scenes, failure_rate=failure_rate, seed=seed)
  backend = RuleBasedBackend(judge, {r.id: r.reference_caption for r in records})
  return make_app(
    backend,
    model=model,
    added_latency_s=added_latency_s,
    api_key=api_key,
    max_body_bytes=max_body_bytes,
    workers=workers,
  )
