"""One chat-completions call to one endpoint, with failures sorted into retryable and final ones and classified
by kind (auth, timeout, connection, http_status, parse) for the failure budget and the preflight."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from typing import Any, Mapping

import httpx

from jaxcap.judges.endpoint import Endpoint

# A fresh id per HTTP request, for matching client and server logs (vLLM adopts it as its request id). Only the
# id travels in a header: the structured request copy for the rule-based server goes in the body (HINT_FIELD).
REQUEST_HEADER = "X-Request-Id"
HINT_FIELD = "jaxcap_request"  # body field: {"primitive": ..., "request": {...}} (jaxcap.judges.server reads it)
HINT_REQUIRED = "jaxcap_request_required"  # error code of a server that needs HINT_FIELD

# Cause of a failed call or judgment (EndpointError.kind, Outcome.cause) -> the kind the failure budget counts.
FAILURE_KINDS = {
  "missing_api_key": "auth",
  "auth": "auth",
  "timeout": "timeout",
  "connection": "connection",
  "all_endpoints_open": "connection",  # breakers open: the fleet counts these under the failures that opened them
  "http_status": "http_status",
  "malformed_response": "parse",
  "unparseable_reply": "parse",
  "image": "image",
  "refused": "refused",  # an in-process judge gave no judgment (e.g. the rule-based judge's injected failures)
}


def failure_kind(cause: str) -> str:
  """The failure budget's kind (auth, timeout, connection, http_status, parse, ...) of a failure cause."""
  return FAILURE_KINDS.get(cause, "other")


def new_request_id() -> str:
  """A UUID4: servers that validate X-Request-Id (llama-cpp-python's starlette-context) accept nothing else."""
  return str(uuid.uuid4())


class EndpointError(Exception):
  """A call that gave no usable reply. `kind` names the cause for metrics (a FAILURE_KINDS key); `retryable`
  says whether another attempt (possibly on another endpoint) may succeed; `status` is the HTTP status, if any;
  `body` the start of the server's error reply."""

  def __init__(self, kind: str, message: str, retryable: bool = True, status: int | None = None, body: str = ""):
    super().__init__(message)
    self.kind = kind
    self.retryable = retryable
    self.status = status
    self.body = body
    self.budget_kind: str | None = None  # overrides failure_kind(kind) for the failure budget


@dataclasses.dataclass(frozen=True)
class ChatReply:
  text: str
  prompt_tokens: int
  completion_tokens: int
  latency_s: float


def auth_headers(endpoint: Endpoint) -> dict[str, str]:
  """The endpoint's Authorization header; EndpointError("missing_api_key") when its key variable is unset."""
  try:
    return endpoint.headers()
  except KeyError as e:
    raise EndpointError("missing_api_key", e.args[0], retryable=False) from None


def error_message(response: httpx.Response, limit: int = 200) -> str:
  """The message of an error reply: OpenAI's {"error": {"message": ...}}, FastAPI's {"detail": ...}, or the
  start of the body."""
  try:
    payload = response.json()
    message = payload["error"]["message"] if isinstance(payload.get("error"), dict) else payload.get("detail")
    if isinstance(message, str) and message:
      return message[:limit]
  except (json.JSONDecodeError, ValueError, AttributeError, KeyError, TypeError):
    pass
  return response.text[:limit] or "(empty body)"


async def post_chat(
  client: httpx.AsyncClient,
  endpoint: Endpoint,
  body: Mapping[str, Any],
  timeout_s: float,
  extra_headers: Mapping[str, str] | None = None,
) -> ChatReply:
  """POSTs `body` to the endpoint's /chat/completions, or to /completions when it holds a raw "prompt" (the reply
  then is choices[0].text); raises EndpointError on any failure."""
  completion = "prompt" in body
  headers = {"Content-Type": "application/json", REQUEST_HEADER: new_request_id(), **(extra_headers or {})}
  headers.update(auth_headers(endpoint))
  start = time.perf_counter()
  try:
    # wait_for bounds the whole exchange; httpx's own timeout only bounds each socket operation.
    response = await asyncio.wait_for(
      client.post(
        endpoint.completions_url if completion else endpoint.chat_url,
        json=dict(body),
        headers=headers,
        timeout=timeout_s,
      ),
      timeout_s,
    )
  except (asyncio.TimeoutError, httpx.TimeoutException):
    raise EndpointError("timeout", f"{endpoint.url}: no reply within {timeout_s:g} s") from None
  except httpx.TransportError as e:
    raise EndpointError("connection", f"{endpoint.url}: {type(e).__name__}: {e}") from None
  latency = time.perf_counter() - start
  status, text = response.status_code, response.text[:2000]
  if status >= 400:
    message = f"{endpoint.url}: HTTP {status}: {error_message(response)}"
    if status == 429 or status >= 500:
      raise EndpointError("http_status", message, status=status, body=text)
    # The request itself is bad (wrong key, model, body) or the judge refused it: a retry gets the same answer.
    raise EndpointError("auth" if status in (401, 403) else "http_status", message, False, status, text)
  try:
    payload = response.json()
    choice = payload["choices"][0]
    text = choice["text"] if completion else choice["message"]["content"]
    if not isinstance(text, str):
      raise TypeError(f"{'text' if completion else 'message.content'} is {type(text).__name__}")
  except (json.JSONDecodeError, ValueError, KeyError, IndexError, TypeError) as e:
    raise EndpointError(
      "malformed_response",
      f"{endpoint.url}: not a {'completions' if completion else 'chat-completions'} response "
      f"({type(e).__name__}: {e}); body starts {response.text[:80]!r}",
    ) from None
  usage = payload.get("usage") or {}
  return ChatReply(
    text=text,
    prompt_tokens=int(usage.get("prompt_tokens") or 0),
    completion_tokens=int(usage.get("completion_tokens") or 0),
    latency_s=latency,
  )


async def get_models(client: httpx.AsyncClient, endpoint: Endpoint, timeout_s: float) -> list[dict[str, Any]]:
  """The entries of the endpoint's GET /models list (each has an "id"); raises EndpointError like post_chat."""
  headers = auth_headers(endpoint)
  try:
    response = await asyncio.wait_for(client.get(endpoint.models_url, headers=headers, timeout=timeout_s), timeout_s)
  except (asyncio.TimeoutError, httpx.TimeoutException):
    raise EndpointError("timeout", f"{endpoint.models_url}: no reply within {timeout_s:g} s") from None
  except httpx.TransportError as e:
    raise EndpointError("connection", f"{endpoint.models_url}: {type(e).__name__}: {e}") from None
  status, text = response.status_code, response.text[:300]
  if status >= 400:
    kind = "auth" if status in (401, 403) else "http_status"
    message = f"{endpoint.models_url}: HTTP {status}: {error_message(response)}"
    raise EndpointError(kind, message, status=status, body=text)
  try:
    rows = response.json()["data"]
    if not isinstance(rows, list):
      raise TypeError("data is not a list")
    return [r for r in rows if isinstance(r, dict)]
  except (json.JSONDecodeError, ValueError, KeyError, TypeError) as e:
    raise EndpointError(
      "malformed_response", f"{endpoint.models_url}: not a model list ({type(e).__name__}: {e})"
    ) from None
