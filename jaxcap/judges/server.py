"""An OpenAI-compatible chat-completions server in front of the rule-based judge.

It lets the default (synthetic-world) run exercise the whole HTTP path — fleet, retries, parsing — with no
LLM. The rule-based judge cannot read free-form prompts, so it answers from the structured copy of the judge
request that `HttpJudge` sends in the `X-Jaxcap-Judge-Request` header, and replies in exactly the format the
prompt asks for (an option letter, or the JSON object of the template's schema). `added_latency_s` delays
every reply (benchmarks: a judge slower than the device).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import Any, Callable, Mapping

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from jaxcap.judges import protocol as P
from jaxcap.judges.chat_client import REQUEST_HEADER
from jaxcap.judges.rule_based import RuleBasedJudge

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


def _request_from_hint(hint: Mapping[str, Any]) -> tuple[str, Any]:
  primitive = hint.get("primitive")
  if primitive not in _REQUEST_TYPES:
    raise ValueError(f"unknown primitive {primitive!r}; known: {sorted(_REQUEST_TYPES)}")
  cls = _REQUEST_TYPES[primitive]
  fields = {f.name for f in dataclasses.fields(cls)}
  raw = {k: tuple(v) if isinstance(v, list) else v for k, v in dict(hint.get("request", {})).items() if k in fields}
  return primitive, cls(**raw)


class RuleBasedBackend:
  """Turns one structured judge request into the reply text an LLM judge would give (or raises)."""

  def __init__(self, judge: RuleBasedJudge, descriptions: Mapping[str, str] | None = None):
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
  requests: int = 0
  in_flight: int = 0
  peak_in_flight: int = 0


def make_app(backend: RuleBasedBackend, *, model: str = "rule-based", added_latency_s: float = 0.0) -> FastAPI:
  """FastAPI app with GET /v1/models, POST /v1/chat/completions, GET /stats."""
  app = FastAPI(title="jaxcap rule-based judge")
  stats = ServerStats()
  app.state.stats = stats

  @app.get("/v1/models")
  async def models():
    return {"object": "list", "data": [{"id": model, "object": "model", "owned_by": "jaxcap"}]}

  @app.get("/stats")
  async def get_stats():
    return dataclasses.asdict(stats)

  @app.post("/v1/chat/completions")
  async def chat(request: Request):
    stats.requests += 1
    stats.in_flight += 1
    stats.peak_in_flight = max(stats.peak_in_flight, stats.in_flight)
    try:
      if added_latency_s > 0:
        await asyncio.sleep(added_latency_s)
      body = await request.json()
      header = request.headers.get(REQUEST_HEADER)
      if not header:
        return JSONResponse(
          {
            "error": {
              "message": f"the rule-based judge needs the {REQUEST_HEADER} "
              "header that jaxcap's HttpJudge sends (RoleConfig."
              "send_request_header=True); it cannot read free-form prompts"
            }
          },
          status_code=400,
        )
      try:
        text = backend.reply(*_request_from_hint(json.loads(header)))
      except (ValueError, TypeError, LookupError) as e:
        return JSONResponse({"error": {"message": str(e)}}, status_code=422)
      prompt_words = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
      return {
        "id": f"chatcmpl-{stats.requests}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", model),
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {
          "prompt_tokens": prompt_words,
          "completion_tokens": len(text.split()),
          "total_tokens": prompt_words + len(text.split()),
        },
      }
    finally:
      stats.in_flight -= 1

  return app


def rule_based_app_for_manifest(
  manifest: str, *, added_latency_s: float = 0.0, failure_rate: float = 0.0, seed: int = 0
) -> FastAPI:
  """The app for a dataset manifest whose rows carry their scene graph (synthetic world)."""
  from jaxcap.data.manifest import read_manifest
  from jaxcap.judges.factory import build_judge

  records, scenes = read_manifest(manifest, require_media=False)
  if not scenes:
    raise ValueError(
      f"Manifest {manifest} has no 'scene' fields; the rule-based judge needs the synthetic "
      "world's ground truth (write it with jaxcap.data.synthetic.manifest.generate_dataset)."
    )
  judge = build_judge({"kind": "rule_based", "failure_rate": failure_rate, "seed": seed}, scenes=scenes)
  backend = RuleBasedBackend(judge, {r.id: r.reference_caption for r in records})
  return make_app(backend, added_latency_s=added_latency_s)
