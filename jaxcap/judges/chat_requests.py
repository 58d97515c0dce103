"""What the judge server accepts: the body read under its size and time limits (`read_body`), the chat request
checked field by field (`parse_chat`), and the structured request copy turned into the primitive's request
dataclass (`request_from_hint`); anything else is a `RequestError` with its HTTP status (always 4xx)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import typing
from typing import Any, Sequence

from fastapi import Request

from jaxcap.judges import protocol as P
from jaxcap.judges.chat_client import HINT_FIELD

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


def request_from_hint(hint: Any) -> tuple[str, Any]:
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


async def read_body(request: Request, limit: int, timeout_s: float) -> bytes:
  """The request body, refusing (413) one longer than `limit` bytes before reading it when Content-Length says
  so, else as soon as the stream passes the limit; 408 when it has not all arrived within `timeout_s`."""
  declared = request.headers.get("content-length")
  if declared is not None and declared.isdigit() and int(declared) > limit:
    raise RequestError(413, f"request body of {int(declared)} bytes exceeds the limit of {limit} bytes", "too_large")
  chunks, size = [], 0
  try:
    async with asyncio.timeout(timeout_s):
      async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
          raise RequestError(413, f"request body exceeds the limit of {limit} bytes", "too_large")
        chunks.append(chunk)
  except TimeoutError:
    raise RequestError(
      408, f"request body not received within {timeout_s:g} s ({size} bytes came)", "timeout"
    ) from None
  return b"".join(chunks)


def parse_chat(raw: bytes, served: Sequence[str], completion: bool = False) -> dict[str, Any]:
  """The chat request (or with `completion`, the /completions request) as a dict, its model and messages (its
  prompt) checked; RequestError on anything malformed."""
  try:
    body = json.loads(raw)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise RequestError(400, f"request body is not valid JSON: {e}") from None
  except RecursionError:  # the parser's depth limit: a request's fault, not the server's (no 5xx to retry)
    raise RequestError(400, "request body nests too deeply to parse; a chat request is a few levels deep") from None
  if not isinstance(body, dict):
    raise RequestError(422, f"request body must be a JSON object, got {type(body).__name__}")
  model = body.get("model")
  if model is not None and not isinstance(model, str):
    raise RequestError(422, f"model: expected a string, got {type(model).__name__}")
  if model is not None and model not in served:
    raise RequestError(404, f"The model `{model}` does not exist; this server serves {list(served)}", "model_not_found")
  if completion:
    if not isinstance(body.get("prompt"), str) or not body["prompt"]:
      raise RequestError(422, "prompt: expected a non-empty string")
    return body
  messages = body.get("messages")
  if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
    raise RequestError(422, "messages: expected a non-empty list of {role, content} objects")
  for i, m in enumerate(messages):
    if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str | list | None):
      raise RequestError(422, f"messages[{i}]: role must be a string and content a string or a list of parts")
  return body
