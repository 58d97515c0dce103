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
serve, 408 a body not received within `body_timeout_s`, 413 body over `max_body_bytes`, 422 fields of the wrong
type or a judgment the judge refuses.

Hostile or careless clients: parsing and judging run in a worker pool (`workers` threads), off the event loop, so
one large request does not stall the others; `jaxcap.judges.serving.server_config` gives uvicorn its connection
limits (idle and request-head timeouts, a connection cap).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, Sequence

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from jaxcap.judges import protocol as P
from jaxcap.judges.chat_requests import RequestError, parse_chat, read_body, request_from_hint
from jaxcap.judges.chat_client import HINT_FIELD, HINT_REQUIRED

DEFAULT_MAX_BODY_BYTES = 16 * 2**20  # a 100 kB caption or an attached image fit; a 50 MB body does not
DEFAULT_WORKERS = 4  # threads that parse and judge requests, off the event loop
DEFAULT_BODY_TIMEOUT_S = 30.0  # a body must arrive within this (408 after)
log = logging.getLogger(__name__)


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
  kind = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    408: "RequestTimeout",
    413: "RequestTooLarge",
  }
  body = {"error": {"message": message, "type": kind.get(status, "UnprocessableEntityError"), "code": code}}
  return JSONResponse(body, status_code=status, headers=headers)


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
        if path.endswith("/completions"):
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
  workers: int = DEFAULT_WORKERS,
  body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
) -> FastAPI:
  """FastAPI app with GET /v1/models, POST /v1/chat/completions and /v1/completions (a raw prompt, as a
  completion-style answerer asks), GET /stats and GET /health (no auth).

  model: the name(s) it serves (a request naming another gets 404, like vLLM); api_key: when set, /v1/* and
  /stats need "Authorization: Bearer <api_key>"; max_body_bytes: larger bodies get 413; workers: threads that
  parse and judge (off the event loop); body_timeout_s: a body not received within it gets 408. Serve it with
  `server_config` (uvicorn's connection limits).
  """
  if workers < 1:
    raise ValueError(f"workers={workers}: must be >= 1 (threads that parse and judge requests).")
  served = [model] if isinstance(model, str) else list(model)
  app = FastAPI(title="jaxcap rule-based judge")
  pool = ThreadPoolExecutor(workers, thread_name_prefix="judge-worker")
  app.state.workers = pool
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

  def judge(raw: bytes, completion: bool = False) -> dict[str, Any]:
    """One request, parsed, judged and answered (a worker thread); raises RequestError."""
    body = parse_chat(raw, served, completion)
    if HINT_FIELD not in body:
      raise RequestError(
        400,
        f"the rule-based judge needs the '{HINT_FIELD}' body field that jaxcap's HttpJudge sends (RoleConfig."
        "request_hint='auto' or 'always'); it cannot read free-form prompts",
        HINT_REQUIRED,
      )
    primitive, judge_request = request_from_hint(body[HINT_FIELD])
    if added_latency_s > 0:
      time.sleep(added_latency_s)  # a worker's time, as a slow judge spends it
    try:
      text = backend.reply(primitive, judge_request)
    except (ValueError, TypeError, LookupError) as e:
      raise RequestError(422, f"the judge gave no judgment: {e}", "judgment_refused") from None
    except Exception as e:  # noqa: BLE001 - deterministic for this request: a retry (5xx) would fail again
      log.exception("rule-based judge failed on a %s request", primitive)
      raise RequestError(422, f"the judge failed on this request ({type(e).__name__}: {e})", "judge_error") from None
    if completion:
      prompt_words = len(body["prompt"].split())
      choice = {"index": 0, "text": text, "finish_reason": "stop"}
    else:
      prompt_words = sum(len(str(m.get("content", "")).split()) for m in body["messages"])
      choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
    return {
      "object": "text_completion" if completion else "chat.completion",
      "created": int(time.time()),
      "model": body.get("model") or served[0],
      "choices": [choice],
      "usage": {
        "prompt_tokens": prompt_words,
        "completion_tokens": len(text.split()),
        "total_tokens": prompt_words + len(text.split()),
      },
    }

  @app.post("/v1/chat/completions")
  async def chat(request: Request):
    return await answer(request, completion=False)

  @app.post("/v1/completions")
  async def complete(request: Request):
    return await answer(request, completion=True)

  async def answer(request: Request, completion: bool):
    stats.requests += 1
    number = stats.requests
    stats.in_flight += 1
    stats.peak_in_flight = max(stats.peak_in_flight, stats.in_flight)
    try:
      raw = await read_body(request, max_body_bytes, body_timeout_s)
      reply = await asyncio.get_running_loop().run_in_executor(pool, judge, raw, completion)
    except RequestError as e:
      stats.refused[e.status] = stats.refused.get(e.status, 0) + 1
      return _error(e.status, str(e), e.code)
    finally:
      stats.in_flight -= 1
    return {"id": f"{'cmpl' if completion else 'chatcmpl'}-{number}", **reply}

  return app
