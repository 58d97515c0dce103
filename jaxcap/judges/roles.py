"""What a judge role is (`RoleConfig`: its endpoints and how they are asked), one judgment to obtain (`JudgeCall`)
and what came of it (`Outcome`)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

from jaxcap.judges.chat_client import failure_kind
from jaxcap.judges.endpoint import Endpoint

STRUCTURED_OUTPUT_MODES = ("json_schema", "json_object", "none")
REQUEST_HINT_MODES = ("auto", "always", "never")


@dataclasses.dataclass(frozen=True)
class RoleConfig:
  """How one judge role (answerer, judge, verifier, ...) is served and asked.

  Times are seconds. `structured_output`: "json_schema" sends OpenAI's response_format with the reply's JSON
  schema (vLLM, SGLang, OpenAI), "json_object" sends {"type": "json_object", "schema": ...} (llama.cpp's
  server), "none" relies on the prompt alone. `send_images` attaches the image for primitives that look at
  it (set for MLLM judges; text-only LLMs leave it off). `request_hint`: when to add the structured copy of the
  judge request (body field "jaxcap_request") that `python -m jaxcap.judge serve --rule-based` answers from:
  "auto" to endpoints whose GET /models says they read it (LLM servers never get it, so vLLM logs no
  ignored-field warnings), "always", or "never".
  """

  endpoints: tuple[Endpoint, ...]
  model: str = "judge"
  temperature: float = 0.0
  max_tokens: int = 512
  extra_sampling: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # e.g. {"top_p": 0.9}
  max_concurrency: int = 16
  timeout_s: float = 60.0
  max_attempts: int = 3  # sends per judgment for endpoint failures (timeouts, 5xx, dead or malformed)
  parse_attempts: int = 2  # fresh asks when a reply does not parse
  retry_temperature: float = 0.7  # temperature of re-asks, so a deterministic judge can answer differently
  backoff_s: float = 0.05
  max_backoff_s: float = 2.0
  breaker_failures: int = 3
  breaker_cooldown_s: float = 5.0
  structured_output: str = "json_schema"
  send_images: bool = False
  request_hint: str = "auto"
  # A request not answered after this many seconds is re-asked once (hedged: on another endpoint when the role
  # has one) and the first answer wins; None: half of timeout_s; math.inf: never. Timeouts are not retried
  # otherwise, so a slow reply costs at most hedge_after_s + timeout_s, and only its own judgment.
  hedge_after_s: float | None = None

  def __post_init__(self):
    object.__setattr__(
      self, "endpoints", tuple(e if isinstance(e, Endpoint) else Endpoint(str(e)) for e in self.endpoints)
    )
    if not self.endpoints:
      raise ValueError("RoleConfig needs at least one endpoint, e.g. Endpoint('http://127.0.0.1:8000/v1').")
    if self.structured_output not in STRUCTURED_OUTPUT_MODES:
      raise ValueError(f"structured_output={self.structured_output!r}: use one of {STRUCTURED_OUTPUT_MODES}.")
    if self.request_hint not in REQUEST_HINT_MODES:
      raise ValueError(f"request_hint={self.request_hint!r}: use one of {REQUEST_HINT_MODES}.")
    for name in ("max_concurrency", "max_attempts", "parse_attempts"):
      if getattr(self, name) < 1:
        raise ValueError(f"RoleConfig.{name}={getattr(self, name)}: must be >= 1.")
    if self.timeout_s <= 0:
      raise ValueError(f"RoleConfig.timeout_s={self.timeout_s}: must be > 0.")
    if self.hedge_after_s is not None and not self.hedge_after_s > 0:
      raise ValueError(
        f"RoleConfig.hedge_after_s={self.hedge_after_s}: must be > 0 (None: half of timeout_s; inf: never hedge)."
      )

  def hedge_delay_s(self) -> float | None:
    """Seconds after which an unanswered request is hedged, or None when it never is."""
    delay = self.timeout_s / 2 if self.hedge_after_s is None else float(self.hedge_after_s)
    return None if math.isinf(delay) else delay

  def sampling(self) -> dict[str, Any]:
    return {
      "model": self.model,
      "temperature": self.temperature,
      "max_tokens": self.max_tokens,
      **dict(self.extra_sampling),
    }

  @classmethod
  def from_json(cls, row: Mapping[str, Any]) -> "RoleConfig":
    row = dict(row)
    if "send_request_header" in row:  # the old name: the copy used to travel in a header
      row.setdefault("request_hint", "auto" if row.pop("send_request_header") else "never")
    endpoints = []
    for e in row.pop("endpoints"):
      endpoints.append(Endpoint(e) if isinstance(e, str) else Endpoint(**e))
    unknown = set(row) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
      raise ValueError(
        f"Unknown role options {sorted(unknown)}; known: {sorted(f.name for f in dataclasses.fields(cls))}."
      )
    return cls(endpoints=tuple(endpoints), **row)


@dataclasses.dataclass(frozen=True)
class JudgeCall:
  """One judgment to obtain: chat `messages` (or a raw `prompt` for the /completions endpoint, messages then
  empty), the reply's JSON `schema` (None for free text), a `parse` that turns reply text into a value or raises
  ReplyParseError, and an optional structured `hint`."""

  messages: tuple[Mapping[str, Any], ...]
  parse: Callable[[str], Any]
  schema: Mapping[str, Any] | None = None
  hint: Mapping[str, Any] | None = None
  prompt: str | None = None


@dataclasses.dataclass(frozen=True)
class Outcome:
  """A parsed value, or `failed` with the error text and its `cause` (a chat_client.FAILURE_KINDS key), never
  both; `status` is the HTTP status of the last failed attempt, if it got one; `sent` is False for a failed
  judgment none of whose requests reached an endpoint (every breaker stayed open through a probe), which the
  failure budget does not count as a failure of the judge (the caller still masks it)."""

  value: Any = None
  failed: bool = False
  error: str = ""
  cause: str = ""
  status: int | None = None
  sent: bool = True

  @property
  def kind(self) -> str:
    """The failure budget's kind: auth, timeout, connection, http_status, parse, image, refused or other."""
    return failure_kind(self.cause) if self.failed else ""
