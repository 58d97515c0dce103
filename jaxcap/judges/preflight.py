"""The judge preflight: before any compute, every endpoint of every configured role answers one tiny real
judgment through the same client path as the run (prompt template, structured output, auth header, parser).

    judge = preflight_judge(build_judge(config.judge, ...), config.judge, records=records)

Whatever fails becomes one JudgePreflightError naming, per failing (role, endpoint), the URL, the cause and the
fix: an unset API-key variable, a refused connection, 401/403, a model name the server does not serve (404,
with the names it does serve), a timeout, a 4xx/5xx, or a reply that does not parse. In-process judges
(rule_based, factory judges without an HTTP fleet) have nothing to reach and pass at once.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from jaxcap.data.records import ImageRecord
from jaxcap.judges import protocol as P
from jaxcap.judges.chat_client import EndpointError
from jaxcap.judges.endpoint import Endpoint
from jaxcap.judges.fleet import JudgeFleet, Outcome, RoleConfig
from jaxcap.judges.http_judge import HttpJudge
from jaxcap.judges.reply_cache import ReplyCache

PROBE_IMAGE_ID = "jaxcap-preflight"
_CAPTION = "A red circle on a white background."
# role -> (primitive, request(image id)): each role is probed with a primitive it serves in a run.
_PROBES: dict[str, tuple[str, Callable[[str], Any]]] = {
  "answerer": (
    "answer_multiple_choice",
    lambda i: P.MultipleChoiceRequest(i, _CAPTION, "What colour is the circle?", ("red", "blue")),
  ),
  "judge": ("split_claims", lambda i: P.CaptionRequest(i, _CAPTION)),
  "rubric_writer": ("write_criteria", lambda i: P.CriteriaWritingRequest(i, "A circle.", ("a red circle",), ())),
  "verifier": ("verify_claims", lambda i: P.ClaimVerificationRequest(i, ("There is a red circle.",))),
  "curator": (
    "answer_visual_questions",
    lambda i: P.VisualQuestionRequest(i, "What colour is the circle?", ("red", "blue"), with_image=True),
  ),
}
_DEFAULT_PROBE = _PROBES["answerer"]


class JudgePreflightError(RuntimeError):
  """A judge endpoint the run needs cannot give a judgment; the message names each endpoint, cause and fix."""


@dataclasses.dataclass(frozen=True)
class ProbeResult:
  role: str
  url: str
  ok: bool
  cause: str = ""  # the failure cause (chat_client.FAILURE_KINDS key), "" when ok
  problem: str = ""
  fix: str = ""

  def line(self) -> str:
    return f"role {self.role!r} at {self.url}: {self.problem}. Fix: {self.fix}"


class _OneEndpoint:
  """What HttpJudge needs of a fleet, sending every role's calls to one probe role; keeps the Outcomes."""

  def __init__(self, fleet: JudgeFleet, key: str, config: RoleConfig):
    self.fleet, self.key, self.config = fleet, key, config
    self.outcomes: list[Outcome] = []

  def role_config(self, role: str) -> RoleConfig:
    return self.config

  def judge(self, role: str, calls):
    self.outcomes = self.fleet.judge(self.key, calls)
    return self.outcomes


def preflight_judge(
  judge: Any,
  config: Mapping[str, Any] | None = None,
  *,
  records: Sequence[ImageRecord] = (),
  roles: Sequence[str] | None = None,
) -> Any:
  """Returns `judge` once every endpoint of its roles answered a probe judgment; raises JudgePreflightError
  otherwise. Skipped when `config.preflight` is false or the judge has no HTTP fleet."""
  if config is not None and not config.preflight:
    return judge
  if not isinstance(judge, HttpJudge):
    return judge
  failures = [r for r in check_judge(judge, records=records, roles=roles) if not r.ok]
  if failures:
    lines = "\n".join(f"  - {r.line()}" for r in failures)
    raise JudgePreflightError(
      f"Judge preflight failed for {len(failures)} endpoint check(s); nothing was run:\n{lines}\n"
      "(judge.preflight=False skips this check.)"
    )
  return judge


def check_judge(
  judge: HttpJudge, *, records: Sequence[ImageRecord] = (), roles: Sequence[str] | None = None
) -> list[ProbeResult]:
  """One ProbeResult per (role, endpoint), probed concurrently; `roles` defaults to the fleet's configured ones."""
  configured = judge.fleet.roles()
  names = list(configured) if roles is None else sorted({judge.fleet.resolve_role(r) for r in roles})
  probes, keyed = [], {}
  for role in names:
    for i, endpoint in enumerate(configured[role].endpoints):
      key = f"{role}#{i}"
      # The run's settings, one endpoint, at most two sends (a transient 5xx is not a broken endpoint).
      keyed[key] = dataclasses.replace(
        configured[role], endpoints=(endpoint,), max_attempts=min(2, configured[role].max_attempts)
      )
      probes.append((role, endpoint, key))
  image_id, images, tmp = _probe_image(judge, records, any(configured[r].send_images for r in names))
  try:
    with JudgeFleet(keyed, cache=ReplyCache(0)) as fleet:
      with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(probes)) or 1) as pool:
        futures = [
          pool.submit(_probe, fleet, key, keyed[key], role, endpoint, judge, images, image_id)
          for role, endpoint, key in probes
        ]
        return [f.result() for f in futures]
  finally:
    if tmp is not None:
      tmp.cleanup()


def _probe_image(judge: HttpJudge, records: Sequence[ImageRecord], needed: bool):
  """(image id, images map, temp dir to clean up): a record of the run (so the rule-based server has its scene),
  or a generated 16x16 PNG when images are sent and no record has one."""
  ids = [r.id for r in records]
  with_image = [i for i in ids if i in judge.images]
  if with_image or not needed:
    return (with_image or ids or [PROBE_IMAGE_ID])[0], judge.images, None
  from PIL import Image

  tmp = tempfile.TemporaryDirectory(prefix="jaxcap-preflight-")
  path = Path(tmp.name) / "probe.png"
  Image.new("RGB", (16, 16), (220, 30, 30)).save(path)
  return PROBE_IMAGE_ID, {**judge.images, PROBE_IMAGE_ID: str(path)}, tmp


def _probe(fleet, key, config, role, endpoint: Endpoint, judge: HttpJudge, images, image_id) -> ProbeResult:
  primitive, make = _PROBES.get(role, _DEFAULT_PROBE)
  adapter = _OneEndpoint(fleet, key, config)
  probe = HttpJudge(adapter, images=images, prompts=judge.prompts)  # type: ignore[arg-type]
  result = getattr(probe, primitive)([make(image_id)])[0]
  if not result.failed:
    return ProbeResult(role, endpoint.url, True)
  outcome = adapter.outcomes[0] if adapter.outcomes else Outcome(failed=True, error=result.error, cause="image")
  problem, fix = explain(outcome, endpoint, config, role, fleet)
  return ProbeResult(role, endpoint.url, False, outcome.cause, problem, fix)


def explain(outcome: Outcome, endpoint: Endpoint, config: RoleConfig, role: str, fleet: JudgeFleet):
  """(problem, fix) of a failed probe judgment."""
  cause, status, error = outcome.cause, outcome.status, outcome.error
  detail = error.split(": ", 1)[1] if ": " in error else error
  detail = detail.removeprefix(f"{endpoint.url}: ").removeprefix(f"{endpoint.chat_url}: ")
  key_env = endpoint.api_key_env
  if cause == "missing_api_key":
    return (
      f"the API key variable {key_env} (judge.api_key_env) is not set, so no request was sent",
      f"export {key_env}=<the key the judge servers were started with> (launch/judge_fleet.sh and "
      f"`python -m jaxcap.judge serve` read the same variable), or set judge.api_key_env='' for servers "
      "without auth",
    )
  if cause == "auth":
    if key_env:
      return (
        f"the server refused the API key in ${key_env} (HTTP {status})",
        f"export {key_env}=<the key this server was started with (its --api-key)>",
      )
    return (
      f"the server requires an API key (HTTP {status}) and judge.api_key_env is empty",
      "export JUDGE_API_KEY=<the server's key> and set judge.api_key_env=JUDGE_API_KEY",
    )
  if cause == "connection":
    return (
      f"cannot connect ({detail})",
      "start the judge server (launch/judge_fleet.sh, or `python -m jaxcap.judge serve --rule-based ...`) "
      "or correct judge.endpoints (the server's /v1 base URL, e.g. http://127.0.0.1:8000/v1)",
    )
  if cause == "timeout":
    return (
      f"no reply within {config.timeout_s:g} s",
      "the server may still be loading its model (wait until GET /v1/models answers), or raise judge.timeout_s",
    )
  if cause == "http_status" and status == 404:
    try:
      served = [str(m.get("id")) for m in fleet.list_models(endpoint, min(config.timeout_s, 10.0))]
    except EndpointError:
      served = None
    if served:
      return (
        f"model {config.model!r} is not served here (HTTP 404); the server serves {served}",
        f"set judge.model={served[0]} (or the role's 'model' in judge.fleet_config), or start the server with "
        f"--served-model-name {config.model} (launch/judge_fleet.sh: SERVED_NAME={config.model})",
      )
    return (
      f"HTTP 404 at {endpoint.chat_url} and no model list at {endpoint.models_url}",
      "judge.endpoints must be the server's OpenAI base URL ending in /v1 (e.g. http://127.0.0.1:8000/v1)",
    )
  if cause == "http_status" and status is not None and status >= 500:
    return (f"server error: {detail}", "see the server's log; it fails on a minimal request")
  if cause == "http_status":
    fix = (
      "if the message is about response_format, set judge.structured_output=json_object (llama.cpp) or none"
      if status == 400
      else "see the message: the server rejects the request the run sends"
    )
    return (f"the request was refused: {detail}", fix)
  if cause in ("malformed_response", "unparseable_reply"):
    return (
      f"the reply cannot be used ({detail[:300]})",
      "point judge.endpoints at an OpenAI-compatible /v1 base URL, use an instruction-tuned judge.model, and "
      "let the server constrain replies (judge.structured_output=json_schema for vLLM / SGLang, json_object for "
      "llama.cpp)",
    )
  if cause == "image":
    return (f"the probe image could not be attached ({detail})", "check the manifest's image paths")
  return (f"no judgment ({error})", f"see the server's log (role {role!r})")
