"""One chat-completions call to one endpoint, with failures sorted into retryable and final ones."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import Any, Mapping

import httpx

from jaxcap.judges.endpoint import Endpoint

REQUEST_HEADER = "X-Jaxcap-Judge-Request"  # structured copy of the judge request, for the rule-based server


class EndpointError(Exception):
  """A call that gave no usable reply. `kind` names the cause for metrics; `retryable` says whether another
  attempt (possibly on another endpoint) may succeed."""

  def __init__(self, kind: str, message: str, retryable: bool = True):
    super().__init__(message)
    self.kind = kind
    self.retryable = retryable


@dataclasses.dataclass(frozen=True)
class ChatReply:
  text: str
  prompt_tokens: int
  completion_tokens: int
  latency_s: float


async def post_chat(
  client: httpx.AsyncClient,
  endpoint: Endpoint,
  body: Mapping[str, Any],
  timeout_s: float,
  extra_headers: Mapping[str, str] | None = None,
) -> ChatReply:
  """POSTs `body` to the endpoint's /chat/completions; raises EndpointError on any failure."""
  headers = {"Content-Type": "application/json", **(extra_headers or {})}
  try:
    headers.update(endpoint.headers())
  except KeyError as e:
    raise EndpointError("missing_api_key", str(e), retryable=False) from None
  start = time.perf_counter()
  try:
    # wait_for bounds the whole exchange; httpx's own timeout only bounds each socket operation.
    response = await asyncio.wait_for(
      client.post(endpoint.chat_url, json=dict(body), headers=headers, timeout=timeout_s), timeout_s
    )
  except (asyncio.TimeoutError, httpx.TimeoutException):
    raise EndpointError("timeout", f"{endpoint.url}: no reply within {timeout_s:g} s") from None
  except httpx.TransportError as e:
    raise EndpointError("connection", f"{endpoint.url}: {type(e).__name__}: {e}") from None
  latency = time.perf_counter() - start
  if response.status_code == 429 or response.status_code >= 500:
    raise EndpointError("http_status", f"{endpoint.url}: HTTP {response.status_code}: {response.text[:200]}")
  if response.status_code >= 400:
    # The request itself is bad (or the judge refused it): another attempt would get the same answer.
    raise EndpointError(
      "http_status", f"{endpoint.url}: HTTP {response.status_code}: {response.text[:200]}", retryable=False
    )
  try:
    payload = response.json()
    text = payload["choices"][0]["message"]["content"]
    if not isinstance(text, str):
      raise TypeError(f"message.content is {type(text).__name__}")
  except (json.JSONDecodeError, ValueError, KeyError, IndexError, TypeError) as e:
    raise EndpointError(
      "malformed_response",
      f"{endpoint.url}: not a chat-completions response ({type(e).__name__}: {e}); body starts {response.text[:80]!r}",
    ) from None
  usage = payload.get("usage") or {}
  return ChatReply(
    text=text,
    prompt_tokens=int(usage.get("prompt_tokens") or 0),
    completion_tokens=int(usage.get("completion_tokens") or 0),
    latency_s=latency,
  )
