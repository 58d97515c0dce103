"""The judge fleet: per-role pools of OpenAI-compatible endpoints behind one background event loop.

For each judgment the fleet picks the role's endpoint with the fewest outstanding requests among those whose
circuit breaker allows traffic, bounds concurrency per role, times out, retries retryable failures with
exponential backoff and full jitter (tenacity), re-asks when the reply does not parse, and caches parsed
replies by (prompt, sampling params). A judgment that still has no parsed reply is returned as a failure
with its cause — the caller masks it; nothing here ever substitutes a default answer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from concurrent.futures import Future
from typing import Any, Callable, Coroutine, Mapping, Sequence

import httpx
import tenacity

from jaxcap.judges.chat_client import REQUEST_HEADER, ChatReply, EndpointError, post_chat
from jaxcap.judges.endpoint import CircuitBreaker, Endpoint
from jaxcap.judges.metrics import RoleMetrics
from jaxcap.judges.parsing import ReplyParseError
from jaxcap.judges.reply_cache import ReplyCache, cache_key

STRUCTURED_OUTPUT_MODES = ("json_schema", "json_object", "none")


@dataclasses.dataclass(frozen=True)
class RoleConfig:
  """How one judge role (answerer, judge, verifier, ...) is served and asked.

  Times are seconds. `structured_output`: "json_schema" sends OpenAI's response_format with the reply's JSON
  schema (vLLM, SGLang, OpenAI), "json_object" sends {"type": "json_object", "schema": ...} (llama.cpp's
  server), "none" relies on the prompt alone. `send_images` attaches the image for primitives that look at
  it (set for MLLM judges; text-only LLMs leave it off).
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
  send_request_header: bool = True  # structured request copy for `python -m jaxcap.judge serve --rule-based`

  def __post_init__(self):
    object.__setattr__(
      self, "endpoints", tuple(e if isinstance(e, Endpoint) else Endpoint(str(e)) for e in self.endpoints)
    )
    if not self.endpoints:
      raise ValueError("RoleConfig needs at least one endpoint, e.g. Endpoint('http://127.0.0.1:8000/v1').")
    if self.structured_output not in STRUCTURED_OUTPUT_MODES:
      raise ValueError(f"structured_output={self.structured_output!r}: use one of {STRUCTURED_OUTPUT_MODES}.")
    for name in ("max_concurrency", "max_attempts", "parse_attempts"):
      if getattr(self, name) < 1:
        raise ValueError(f"RoleConfig.{name}={getattr(self, name)}: must be >= 1.")
    if self.timeout_s <= 0:
      raise ValueError(f"RoleConfig.timeout_s={self.timeout_s}: must be > 0.")

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
  """One judgment to obtain: chat `messages`, the reply's JSON `schema` (None for free text), a `parse`
  that turns reply text into a value or raises ReplyParseError, and an optional structured `hint`."""

  messages: tuple[Mapping[str, Any], ...]
  parse: Callable[[str], Any]
  schema: Mapping[str, Any] | None = None
  hint: Mapping[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class Outcome:
  """A parsed value, or `failed` with the cause (never both)."""

  value: Any = None
  failed: bool = False
  error: str = ""


class _EndpointState:
  def __init__(self, endpoint: Endpoint, config: RoleConfig):
    self.endpoint = endpoint
    self.breaker = CircuitBreaker(config.breaker_failures, config.breaker_cooldown_s)
    self.outstanding = 0


class _RolePool:
  """Endpoints of one role with their breakers, the role's semaphore and metrics (event-loop side)."""

  def __init__(self, role: str, config: RoleConfig):
    self.role = role
    self.config = config
    self.endpoints = [_EndpointState(e, config) for e in config.endpoints]
    self.metrics = RoleMetrics(role)
    self.semaphore: asyncio.Semaphore | None = None  # created inside the loop

  def pick(self) -> _EndpointState:
    """The allowed endpoint with the fewest outstanding requests (ties: configuration order)."""
    allowed = [e for e in self.endpoints if e.breaker.allows()]
    if not allowed:
      raise EndpointError(
        "all_endpoints_open",
        f"role {self.role!r}: every endpoint's circuit breaker is open ({[e.endpoint.url for e in self.endpoints]})",
      )
    return min(allowed, key=lambda e: e.outstanding)


class JudgeFleet:
  """Roles -> endpoint pools. Sync API (`judge`, `submit`) for callers outside asyncio; use as a context
  manager or call `close()`.

  roles: role name -> RoleConfig. A primitive asks for a role by name; `fallback_role` serves roles that are
  not configured (so one server can play every role).
  """

  def __init__(
    self, roles: Mapping[str, RoleConfig], *, fallback_role: str | None = None, cache: ReplyCache | None = None
  ):
    if not roles:
      raise ValueError("JudgeFleet needs at least one role, e.g. {'judge': RoleConfig(endpoints=(...))}.")
    if fallback_role is not None and fallback_role not in roles:
      raise ValueError(f"fallback_role {fallback_role!r} is not among the roles {sorted(roles)}.")
    self.fallback_role = fallback_role if fallback_role is not None else next(iter(roles))
    self.cache = cache if cache is not None else ReplyCache()
    self._pools = {name: _RolePool(name, cfg) for name, cfg in roles.items()}
    self._loop = asyncio.new_event_loop()
    self._thread = threading.Thread(target=self._loop.run_forever, name="judge-fleet", daemon=True)
    self._thread.start()
    self._client: httpx.AsyncClient = self._run(self._start())
    self._closed = False

  async def _start(self) -> httpx.AsyncClient:
    for pool in self._pools.values():
      pool.semaphore = asyncio.Semaphore(pool.config.max_concurrency)
    total = sum(p.config.max_concurrency for p in self._pools.values())
    return httpx.AsyncClient(limits=httpx.Limits(max_connections=total, max_keepalive_connections=total))

  def _run(self, coro: Coroutine) -> Any:
    return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

  # -- public API -----------------------------------------------------------------------------------------

  def resolve_role(self, role: str) -> str:
    return role if role in self._pools else self.fallback_role

  def role_config(self, role: str) -> RoleConfig:
    return self._pools[self.resolve_role(role)].config

  def judge(self, role: str, calls: Sequence[JudgeCall]) -> list[Outcome]:
    """One outcome per call, in order; blocks until all are done (each is bounded by its retries)."""
    return self.submit(role, calls).result()

  def submit(self, role: str, calls: Sequence[JudgeCall]) -> Future:
    """Like `judge` but returns a concurrent.futures.Future of the outcomes at once."""
    if self._closed:
      raise RuntimeError("JudgeFleet is closed; create a new one.")
    pool = self._pools[self.resolve_role(role)]
    return asyncio.run_coroutine_threadsafe(self._judge_all(pool, list(calls)), self._loop)

  def metrics(self) -> dict[str, float]:
    """Every role's metrics, "judge/<role>/<name>" -> value."""
    out: dict[str, float] = {}
    for pool in self._pools.values():
      out.update(pool.metrics.snapshot())
    return out

  def role_metrics(self, role: str) -> RoleMetrics:
    return self._pools[self.resolve_role(role)].metrics

  def breaker_states(self, role: str) -> dict[str, str]:
    return {e.endpoint.url: e.breaker.state for e in self._pools[self.resolve_role(role)].endpoints}

  def close(self) -> None:
    if self._closed:
      return
    self._closed = True
    self._run(self._client.aclose())
    self._loop.call_soon_threadsafe(self._loop.stop)
    self._thread.join(timeout=5)

  def __enter__(self) -> "JudgeFleet":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  # -- event-loop side ------------------------------------------------------------------------------------

  async def _judge_all(self, pool: _RolePool, calls: list[JudgeCall]) -> list[Outcome]:
    return list(await asyncio.gather(*(self._judge_one(pool, call) for call in calls)))

  async def _judge_one(self, pool: _RolePool, call: JudgeCall) -> Outcome:
    cfg, metrics = pool.config, pool.metrics
    metrics.record(judgment=True)
    sampling = cfg.sampling()
    key = cache_key(call.messages, sampling)
    cached = self.cache.get(key)
    if cached is not None:
      try:
        value = call.parse(cached)
        metrics.record(cache_hit=True)
        return Outcome(value)
      except ReplyParseError:
        pass  # the parser changed since this was cached: ask again
    error = ""
    for ask in range(cfg.parse_attempts):
      params = sampling if ask == 0 else {**sampling, "temperature": max(cfg.temperature, cfg.retry_temperature)}
      try:
        reply = await self._send_with_retries(pool, call, params)
      except EndpointError as e:
        metrics.record(failed=True)
        return Outcome(failed=True, error=f"{e.kind}: {e}")
      try:
        value = call.parse(reply.text)
      except ReplyParseError as e:
        metrics.record(failure="unparseable_reply")
        error = f"unparseable_reply: {e}"
        continue
      self.cache.put(key, reply.text)  # under the original question's key: the next ask is free
      return Outcome(value)
    metrics.record(failed=True)
    return Outcome(failed=True, error=f"{error} (after {cfg.parse_attempts} asks)")

  async def _send_with_retries(self, pool: _RolePool, call: JudgeCall, params: Mapping[str, Any]) -> ChatReply:
    cfg = pool.config
    body: dict[str, Any] = {"messages": list(call.messages), **params}
    if call.schema is not None and cfg.structured_output == "json_schema":
      body["response_format"] = {
        "type": "json_schema",
        "json_schema": {"name": "judgment", "schema": dict(call.schema)},
      }
    elif call.schema is not None and cfg.structured_output == "json_object":
      body["response_format"] = {"type": "json_object", "schema": dict(call.schema)}
    headers = {}
    if cfg.send_request_header and call.hint is not None:
      headers[REQUEST_HEADER] = json.dumps(call.hint, ensure_ascii=True, separators=(",", ":"))
    retrying = tenacity.AsyncRetrying(
      stop=tenacity.stop_after_attempt(cfg.max_attempts),
      wait=tenacity.wait_random_exponential(multiplier=cfg.backoff_s, max=cfg.max_backoff_s),
      retry=tenacity.retry_if_exception(lambda e: isinstance(e, EndpointError) and e.retryable),
      reraise=True,
    )
    async for attempt in retrying:
      with attempt:
        return await self._send_once(pool, body, headers)
    raise AssertionError("unreachable: tenacity reraises the last error")

  async def _send_once(self, pool: _RolePool, body: Mapping[str, Any], headers: Mapping[str, str]) -> ChatReply:
    assert pool.semaphore is not None
    async with pool.semaphore:
      try:
        state = pool.pick()
      except EndpointError as e:
        pool.metrics.record(failure=e.kind)
        raise
      url = state.endpoint.url
      state.outstanding += 1
      state.breaker.on_send()
      pool.metrics.record_request_start(url)
      try:
        reply = await post_chat(self._client, state.endpoint, body, pool.config.timeout_s, headers)
      except EndpointError as e:
        # A refused request (4xx) says nothing about the endpoint's health.
        if e.retryable:
          state.breaker.on_failure()
        else:
          state.breaker.on_success()
        pool.metrics.record_request_end(url, failure=e.kind)
        raise
      except BaseException:
        state.breaker.probing = False
        pool.metrics.record_request_end(url, failure="cancelled")
        raise
      finally:
        state.outstanding -= 1
      state.breaker.on_success()
      pool.metrics.record_request_end(
        url, latency_s=reply.latency_s, prompt_tokens=reply.prompt_tokens, completion_tokens=reply.completion_tokens
      )
      return reply
