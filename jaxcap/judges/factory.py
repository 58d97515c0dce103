"""The one judge factory: a judge config (the same fields for the trainer, `jaxcap.eval` and the CLIs) -> a Judge.

    judge = build_judge(config.judge, scenes=scenes, records=records)
    judge = preflight_judge(judge, config.judge, records=records)   # http: every endpoint answers, or a clear error

Judge kinds are registered in `JUDGE_KINDS`:
  rule_based  the synthetic world's deterministic judge over the manifest's ground-truth scenes (registered by
              `jaxcap.world`, which every entry point imports)
  http        LLM judges behind OpenAI-compatible servers (vLLM, SGLang, llama.cpp, TGI): `endpoints` serving
              `model` for every role, or `fleet_config` (JSON: role -> RoleConfig fields)
  factory     any `package.module:function` returning a Judge, called with `options`
  none        no judge, for runs whose rewards need none (`jaxcap.judges.no_judge`)
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from jaxcap.data.records import ImageRecord
from jaxcap.judges.protocol import Judge
from jaxcap.registry import Registry

# kind -> build(config, *, scenes, records, seed) -> Judge
JUDGE_KINDS: Registry[Callable[..., Judge]] = Registry("judge kind", field="judge.kind")


def build_judge(
  config,  # a jaxcap.judges.settings.JudgeConfig
  *,
  scenes: Mapping[str, Any] | None = None,
  records: Sequence[ImageRecord] = (),
  seed: int | None = None,
) -> Judge:
  """The judge `config.kind` names; `scenes` (id -> Scene) feed the rule-based judge, `records` tell an HTTP
  judge where each image is; `seed` overrides `config.seed`."""
  build = JUDGE_KINDS[config.kind]
  seed = int(config.seed if seed is None else seed)
  return build(config, scenes=dict(scenes or {}), records=list(records), seed=seed)


def judge_name(config) -> str:
  """How reports name the judge: its kind, or the factory it came from."""
  return str(config.factory) if config.kind == "factory" else str(config.kind)


@JUDGE_KINDS.register("http")
def http_judge(config, *, scenes, records, seed) -> Judge:
  from jaxcap.judges.endpoint import Endpoint
  from jaxcap.judges.fleet import JudgeFleet, RoleConfig
  from jaxcap.judges.http_judge import HttpJudge, images_from_records
  from jaxcap.judges.prompts import PromptLibrary

  if config.fleet_config:
    rows = json.loads(Path(config.fleet_config).read_text())
    roles = {name: RoleConfig.from_json(row) for name, row in rows.items()}
  else:
    urls = [u.strip() for u in config.endpoints.split(",") if u.strip()]
    if not urls:
      raise ValueError(
        "judge.kind='http' needs judge.endpoints=http://host:port/v1[,...] or judge.fleet_config=FILE.json "
        "(on the command line: --config.judge.endpoints=... or --endpoint URL; see launch/ for starting a "
        "vLLM/SGLang fleet)"
      )
    key_env = config.api_key_env or None
    role = RoleConfig(
      endpoints=tuple(Endpoint(u, key_env) for u in urls),
      model=config.model or "judge",
      timeout_s=float(config.timeout_s),
      max_concurrency=int(config.max_concurrency),
      send_images=bool(config.send_images),
      structured_output=config.structured_output,
    )
    roles = {"judge": role}
  a = config.answerer
  fallback = roles.get("judge") or next(iter(roles.values()))
  sampled = dict(temperature=float(a.temperature), max_tokens=int(a.max_tokens))
  if "answerer" not in roles and sampled != dict(temperature=fallback.temperature, max_tokens=fallback.max_tokens):
    roles["answerer"] = dataclasses.replace(fallback, **sampled)  # the judge's endpoints, sampled as judge.answerer
  prompts = PromptLibrary(config.prompt_dir or None)
  return HttpJudge(JudgeFleet(roles), images=images_from_records(records), prompts=prompts, answerer=a)


@JUDGE_KINDS.register("factory")
def factory_judge(config, *, scenes, records, seed) -> Judge:
  module, _, attr = str(config.factory).rpartition(":")
  if not module:
    raise ValueError(f"judge.factory={config.factory!r}: write 'package.module:function'.")
  judge = getattr(importlib.import_module(module), attr)(**dict(config.options or {}))
  if not isinstance(judge, Judge):
    raise TypeError(
      f"judge.factory {config.factory!r} returned {type(judge).__name__}, which lacks the "
      "jaxcap.judges.protocol.Judge methods."
    )
  return judge


@JUDGE_KINDS.register("none")
def no_judge(config, *, scenes, records, seed) -> Judge:
  from jaxcap.judges.no_judge import NoJudge

  return NoJudge()


@contextlib.contextmanager
def opened_judge(judge: Judge, *, report: bool = False) -> Iterator[Judge]:
  """Yields `judge` and closes its HTTP fleet afterwards (printing the fleet's metrics when `report`)."""
  try:
    yield judge
  finally:
    fleet = getattr(judge, "fleet", None)
    if fleet is not None:
      if report:
        print(json.dumps(fleet.metrics(), indent=1))
      fleet.close()
