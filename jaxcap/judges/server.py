"""An OpenAI-compatible chat-completions server in front of a structured judge (the rule-based one:
`jaxcap.world.judge_server`).

It lets the default (synthetic-world) run exercise the whole HTTP path — fleet, retries, parsing — with no
LLM. The rule-based judge cannot read free-form prompts, so it answers from the structured copy of the judge
request that `HttpJudge` puts in the body field "jaxcap_request" (the fleet sends it because GET /v1/models
says this server reads it), and replies in exactly the format the prompt asks for (an option letter, or the JSON
object of the template's schema). `added_latency_s` delays every reply (benchmarks: a judge slower than the
device).

Bad requests get an OpenAI-style JSON error and a 4xx status, never a 500 (clients retry 5xx): 400 body not
JSON or no "jaxcap_request", 401 missing / wrong bearer token (when `api_key` is set), 404 a model it does not
serve, 413 body over `max_body_bytes`, 422 fields of the wrong type or a judgment the judge refuses.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import logging
import time
import typing
from typing import Any, Callable, Mapping, Sequence

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from jaxcap.judges import protocol as P
from jaxcap.judges.chat_client import HINT_FIELD, HINT_REQUIRED

DEFAULT_MAX_BODY_BYTES = 16 * 2**20  # a 100 kB caption or an attached image fit; a 50 MB body does not
log = logging.getLogger(__name__)

_REQUEST_TYPES: dict[str, type] = {
  "answer_multiple_choice": P.MultipleChoiceRequest,
  "answer_visual_questions": P.VisualQuestionRequest,
  "check_criteria": P.CriterionRequest,
  "write_criteria": P.CriteriaWritingRequest,
  "split_claims": P.CaptionRequest,
  "verify_claims": P.ClaimVerificationRequest,
  "match_reference_units": P.CoverageRequest,
  "rate_language": P.CaptionRequest,
  "compare_captions": P.PairwiseRequest,
  "score_likert": P.LikertRequest,
}


class RequestError(ValueError):
  """A request the server refuses: HTTP `status`, OpenAI-style error `code`."""

  def __init__(self, status: int, message: str, code: str = "invalid_request_error"):
    super().__init__(message)
    self.status = status
    self.code = code


def _typed(value: Any, annotation: Any, where: str) -> Any:
  """`value` checked against a request field's annotation (str, bool, tuple[str, ...], X | None); lists become
  tuples. Raises RequestError(422) naming the field."""
  args = typing.get_args(annotation)
  if type(None) in args:
    if value is None:
      return None
    annotation = next(a for a in args if a is not type(None))
    args = typing.get_args(annotation)
  if typing.get_origin(annotation) is tuple:
    if not isinstance(value, list | tuple):
      raise RequestError(422, f"{where}: expected a list, got {type(value).__name__}")
    return tuple(_typed(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
  if annotation is bool and isinstance(value, bool) or annotation is str and isinstance(value, str):
    return value
  names = {str: "a string", bool: "true or false"}
  raise RequestError(422, f"{where}: expected {names.get(annotation, annotation)}, got {type(value).__name__}")


def _request_from_hint(hint: Any) -> tuple[str, Any]:
  """(primitive, request dataclass) from the body's "jaxcap_request"; RequestError(422) on any bad field."""
  if not isinstance(hint, dict):
    raise RequestError(422, f"{HINT_FIELD} must be an object, got {type(hint).__name__}")
  primitive = hint.get("primitive")
  if primitive not in _REQUEST_TYPES:
    raise RequestError(422, f"{HINT_FIELD}.primitive: unknown primitive {primitive!r}; known: {sorted(_REQUEST_TYPES)}")
  raw = hint.get("request", {})
  if not isinstance(raw, dict):
    raise RequestError(422, f"{HINT_FIELD}.request must be an object, got {type(raw).__name__}")
  cls = _REQUEST_TYPES[primitive]
  hints = typing.get_type_hints(cls)
  fields = {}
  for f in dataclasses.fields(cls):
    if f.name in raw:
      fields[f.name] = _typed(raw[f.name], hints[f.name], f"{HINT_FIELD}.request.{f.name}")
    elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
      raise RequestError(422, f"{HINT_FIELD}.request: missing field {f.name!r} for {primitive}")
  return primitive, cls(**fields)


class RuleBasedBackend:
  """Turns one structured judge request into the reply text an LLM judge would give (or raises)."""

  def __init__(self, judge: P.Judge, descriptions: Mapping[str, str] | None = None):
    self.judge = judge
    # QA curation stand-in for "the image": the scene's full description (reference caption).
    self.descriptions = dict(descriptions or {})

  def reply(self, primitive: str, request: Any) -> str:
    if primitive == "answer_visual_questions":
      caption = self.descriptions.get(request.image_id, "") if request.with_image else ""
      primitive, request = (
        "answer_multiple_choice",
        P.MultipleChoiceRequest(request.image_id, caption, request.question, request.options),
      )
    result = getattr(self.judge, primitive)([request])[0]
    if result.failed:
      raise LookupError(result.error)
    render: Callable[[Any], Any] = {
      "answer_multiple_choice": lambda r: r.reply,
      "check_criteria": lambda r: {"passed": r.passed},
      "write_criteria": lambda r: {"criteria": [{"text": c.text, "severity": c.severity} for c in r.criteria]},
      "split_claims": lambda r: {"claims": list(r.claims)},
      "verify_claims": lambda r: {"verdicts": [{"correct": c, "pointable": p} for c, p in zip(r.correct, r.pointable)]},
      "match_reference_units": lambda r: {"covered": list(r.covered)},
      "rate_language": lambda r: {"clarity": int(r.clarity), "fluency": int(r.fluency), "coherence": int(r.coherence)},
      "compare_captions": lambda r: {"winner": r.winner},
      "score_likert": lambda r: {"score": int(r.score)},
    }[primitive]
    value = render(result)
    return value if isinstance(value, str) else json.dumps(value)


@dataclasses.dataclass
class ServerStats:
  requests: int = 0  # chat requests received, refused ones included
  in_flight: int = 0
  peak_in_flight: int = 0
  refused: dict[int, int] = dataclasses.field(default_factory=dict)  # HTTP status -> refused requests


def _error(status: int, message: str, code: str = "invalid_request_error", headers=None) -> JSONResponse:
  kind = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 413: "RequestTooLarge"}
  body = {"error": {"message": message, "type": kind.get(status, "UnprocessableEntityError"), "code": code}}
  return JSONResponse(body, status_code=status, headers=headers)


async def _read_body(request: Request, limit: int) -> bytes:
  """The request body, refusing (413) one longer than `limit` bytes before reading it when Content-Length says
  so, else as soon as the stream passes the limit."""
  declared = request.headers.get("content-length")
  if declared is not None and declared.isdigit() and int(declared) > limit:
    raise RequestError(413, f"request body of {int(declared)} bytes exceeds the limit of {limit} bytes", "too_large")
  chunks, size = [], 0
  async for chunk in request.stream():
    size += len(chunk)
    if size > limit:
      raise RequestError(413, f"request body exceeds the limit of {limit} bytes", "too_large")
    chunks.append(chunk)
  return b"".join(chunks)


def _parse_chat(raw: bytes, served: Sequence[str]) -> dict[str, Any]:
  """The chat request as a dict, its model and messages checked; RequestError on anything malformed."""
  try:
    body = json.loads(raw)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise RequestError(400, f"request body is not valid JSON: {e}") from None
  if not isinstance(body, dict):
    raise RequestError(422, f"request body must be a JSON object, got {type(body).__name__}")
  model = body.get("model")
  if model is not None and not isinstance(model, str):
    raise RequestError(422, f"model: expected a string, got {type(model).__name__}")
  if model is not None and model not in served:
    raise RequestError(404, f"The model `{model}` does not exist; this server serves {list(served)}", "model_not_found")
  messages = body.get("messages")
  if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
    raise RequestError(422, "messages: expected a non-empty list of {role, content} objects")
  for i, m in enumerate(messages):
    if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str | list | None):
      raise RequestError(422, f"messages[{i}]: role must be a string and content a string or a list of parts")
  return body


class _Guard:
  """ASGI middleware: the bearer-token check (/v1/* and /stats, when a key is set) and a JSON 500 without a
  traceback for anything unexpected (the traceback goes to the server log)."""

  def __init__(self, app, expected: bytes | None, stats: ServerStats):
    self.app, self.expected, self.stats = app, expected, stats

  async def __call__(self, scope, receive, send):
    if scope["type"] != "http":
      return await self.app(scope, receive, send)
    path = scope["path"]
    if self.expected is not None and (path.startswith("/v1/") or path == "/stats"):
      got = dict(scope["headers"]).get(b"authorization", b"")
      if not hmac.compare_digest(got, self.expected):
        if path.endswith("/chat/completions"):
          self.stats.requests += 1
          self.stats.refused[401] = self.stats.refused.get(401, 0) + 1
        reason = "no Authorization header" if not got else "wrong API key"
        response = _error(
          401,
          f"{reason}: send 'Authorization: Bearer <key>' with the key this server was started with "
          "(client: export the variable judge.api_key_env names)",
          "invalid_api_key",
          headers={"WWW-Authenticate": "Bearer"},
        )
        return await response(scope, receive, send)
    started = False

    async def watched_send(message):
      nonlocal started
      started = started or message["type"] == "http.response.start"
      await send(message)

    try:
      await self.app(scope, receive, watched_send)
    except Exception as e:  # noqa: BLE001 - a bug must not become a retried 500 with a traceback body
      log.exception("judge server: unexpected error on %s", path)
      if not started:
        await _error(500, f"internal error ({type(e).__name__}); see the server log", "internal_error")(
          scope, receive, send
        )


def make_app(
  backend: RuleBasedBackend,
  *,
  model: str | Sequence[str] = "judge",
  added_latency_s: float = 0.0,
  api_key: str | None = None,
  max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> FastAPI:
  """FastAPI app with GET /v1/models, POST /v1/chat/completions, GET /stats and GET /health (no auth).

  model: the name(s) it serves (a request naming another gets 404, like vLLM); api_key: when set, /v1/* and
  /stats need "Authorization: Bearer <api_key>"; max_body_bytes: larger bodies get 413.
  """
  served = [model] if isinstance(model, str) else list(model)
  app = FastAPI(title="jaxcap rule-based judge")
  stats = ServerStats()
  app.state.stats = stats
  expected = f"Bearer {api_key}".encode() if api_key else None

  app.add_middleware(_Guard, expected=expected, stats=stats)

  @app.get("/health")
  async def health():
    return {"status": "ok"}

  @app.get("/v1/models")
  async def models():
    rows = [{"id": m, "object": "model", "owned_by": "jaxcap", HINT_FIELD: True} for m in served]
    return {"object": "list", "data": rows}

  @app.get("/stats")
  async def get_stats():
    return dataclasses.asdict(stats)

  @app.post("/v1/chat/completions")
  async def chat(request: Request):
    stats.requests += 1
    stats.in_flight += 1
    stats.peak_in_flight = max(stats.peak_in_flight, stats.in_flight)
    try:
      body = _parse_chat(await _read_body(request, max_body_bytes), served)
      if HINT_FIELD not in body:
        raise RequestError(
          400,
          f"the rule-based judge needs the '{HINT_FIELD}' body field that jaxcap's HttpJudge sends (RoleConfig."
          "request_hint='auto' or 'always'); it cannot read free-form prompts",
          HINT_REQUIRED,
        )
      primitive, judge_request = _request_from_hint(body[HINT_FIELD])
      if added_latency_s > 0:
        await asyncio.sleep(added_latency_s)
      try:
        text = backend.reply(primitive, judge_request)
      except (ValueError, TypeError, LookupError) as e:
        raise RequestError(422, f"the judge gave no judgment: {e}", "judgment_refused") from None
      except Exception as e:  # noqa: BLE001 - deterministic for this request: a retry (5xx) would fail again
        log.exception("rule-based judge failed on a %s request", primitive)
        raise RequestError(422, f"the judge failed on this request ({type(e).__name__}: {e})", "judge_error") from None
    except RequestError as e:
      stats.refused[e.status] = stats.refused.get(e.status, 0) + 1
      return _error(e.status, str(e), e.code)
    finally:
      stats.in_flight -= 1
    prompt_words = sum(len(str(m.get("content", "")).split()) for m in body["messages"])
    return {
      "id": f"chatcmpl-{stats.requests}",
      "object": "chat.completion",
      "created": int(time.time()),
      "model": body.get("model") or served[0],
      "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
      "usage": {
        "prompt_tokens": prompt_words,
        "completion_tokens": len(text.split()),
        "total_tokens": prompt_words + len(text.split()),
      },
    }

  return app
