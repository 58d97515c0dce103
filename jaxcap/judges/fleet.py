"""The judge fleet: per-role pools of OpenAI-compatible endpoints behind one background event loop.

For each judgment the fleet picks the role's endpoint with the fewest outstanding requests among those whose
circuit breaker allows traffic (waiting for a probe while every breaker is open: `jaxcap.judges.pool`), bounds
concurrency per role, times out, hedges a slow request once and retries other retryable failures with
exponential backoff and full jitter (`jaxcap.judges.sending`), re-asks when the reply does not parse, and caches
parsed replies by (prompt, sampling params). A judgment that still has no parsed reply is returned as a failure
with its cause — the caller masks it and the fleet counts it by kind (`failures_by_kind`); nothing here ever
substitutes a default answer.

Closing the fleet (or interpreter exit, for a fleet nobody closed) cancels judgments in flight, closes the HTTP
client and then the event loop, so a run that stops on an error neither hangs on its judge nor prints
"Event loop is closed" tracebacks.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures.thread  # noqa: F401  (its exit hook must be registered before ours: see the end)
import threading
import warnings
import weakref
from concurrent.futures import Future
from typing import Any, Coroutine, Mapping, Sequence

import httpx

from jaxcap.judges.chat_client import (
  EndpointError,
  failure_kind,
  get_models,
)
from jaxcap.judges.endpoint import Endpoint
from jaxcap.judges.metrics import RoleMetrics
from jaxcap.judges.parsing import ReplyParseError
from jaxcap.judges.pool import RolePool
from jaxcap.judges.reply_cache import ReplyCache, cache_key
from jaxcap.judges.sending import Tries, send_with_retries
from jaxcap.judges.roles import (  # noqa: F401  (re-exported: their old home)
  REQUEST_HINT_MODES,
  STRUCTURED_OUTPUT_MODES,
  JudgeCall,
  Outcome,
  RoleConfig,
)


KEEPALIVE_S = 2.0  # seconds an idle connection stays in the client's pool


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
    self._pools = {name: RolePool(name, cfg) for name, cfg in roles.items()}
    self._closed = False
    self.last_error = ""  # the error of the last failed judgment, "<cause>: <message>"
    self._loop = asyncio.new_event_loop()
    self._thread = threading.Thread(target=self._loop.run_forever, name="judge-fleet", daemon=True)
    self._thread.start()
    self._client: httpx.AsyncClient = self._run(self._start())
    _OPEN_FLEETS.add(self)

  async def _start(self) -> httpx.AsyncClient:
    for pool in self._pools.values():
      pool.start()
    total = sum(p.config.max_concurrency for p in self._pools.values())
    # Idle pooled connections are dropped before a server's idle timeout (uvicorn's and vLLM's: 5 s, httpx's own
    # expiry) can close one just as a request goes out on it (a ReadError and a retry).
    limits = httpx.Limits(max_connections=total, max_keepalive_connections=total, keepalive_expiry=KEEPALIVE_S)
    return httpx.AsyncClient(limits=limits)

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

  def roles(self) -> dict[str, RoleConfig]:
    """The configured roles (not the ones served by the fallback role)."""
    return {name: pool.config for name, pool in self._pools.items()}

  def failures_by_kind(self) -> dict[str, int]:
    """Failed judgments of every role by kind (auth, timeout, connection, http_status, parse, ...), cumulative."""
    out: dict[str, int] = {}
    for pool in self._pools.values():
      for kind, count in pool.metrics.counts()[2].items():
        out[kind] = out.get(kind, 0) + count
    return out

  def unsent_judgments(self) -> int:
    """Failed judgments of every role that no endpoint took (every breaker open through a probe), cumulative."""
    return sum(pool.metrics.unsent_judgments for pool in self._pools.values())

  def judgment_counts(self) -> tuple[int, int, dict[str, int]]:
    """(judgments tried, tried judgments failed, failed by kind) over every role, cumulative (`unsent_judgments`
    are masked and counted apart: no request of theirs was tried)."""
    asked = sum(pool.metrics.counts()[0] for pool in self._pools.values())
    failed = sum(pool.metrics.counts()[1] for pool in self._pools.values())
    return asked, failed, self.failures_by_kind()

  def list_models(self, endpoint: Endpoint, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """The entries of `endpoint`'s GET /models (raises EndpointError)."""
    return self._run(get_models(self._client, endpoint, timeout_s))

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
    """Cancels judgments in flight (their callers get CancelledError), closes the HTTP client, then the loop."""
    if self._closed:
      return
    self._closed = True
    _OPEN_FLEETS.discard(self)
    # anyio's connect_tcp, cancelled while it starts its connection attempts, drops one never-started coroutine
    # (a RuntimeWarning at exit); nothing is lost: the attempt was cancelled on purpose.
    warnings.filterwarnings("ignore", message="coroutine 'connect_tcp.<locals>.try_connect' was never awaited")
    if self._thread.is_alive():
      try:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=10)
      except Exception:  # noqa: BLE001 - closing must not raise over the error that made the caller close
        pass
      self._loop.call_soon_threadsafe(self._loop.stop)
      self._thread.join(timeout=10)
    if not self._thread.is_alive() and not self._loop.is_closed():
      self._loop.close()

  async def _shutdown(self) -> None:
    for _ in range(10):  # cancelled tasks may start others (e.g. httpx's connection attempts): until none is left
      tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
      if not tasks:
        break
      for task in tasks:
        task.cancel()
      await asyncio.gather(*tasks, return_exceptions=True)
      await asyncio.sleep(0)
    await self._client.aclose()
    await self._loop.shutdown_asyncgens()

  def __enter__(self) -> "JudgeFleet":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  # -- event-loop side ------------------------------------------------------------------------------------

  async def _judge_all(self, pool: RolePool, calls: list[JudgeCall]) -> list[Outcome]:
    return list(await asyncio.gather(*(self._judge_one(pool, call) for call in calls)))

  async def _judge_one(self, pool: RolePool, call: JudgeCall) -> Outcome:
    cfg, metrics = pool.config, pool.metrics
    metrics.record(judgment=True)
    sampling = cfg.sampling()
    key = cache_key(call.messages if call.prompt is None else [{"prompt": call.prompt}], sampling)
    # a sampled judge (temperature > 0) is asked every time: N draws of one question are N samples, not one
    cached = self.cache.get(key) if cfg.temperature == 0 else None
    if cached is not None:
      try:
        value = call.parse(cached)
        metrics.record(cache_hit=True)
        return Outcome(value)
      except ReplyParseError:
        pass  # the parser changed since this was cached: ask again
    error = ""
    tries = Tries()
    for ask in range(cfg.parse_attempts):
      params = sampling if ask == 0 else {**sampling, "temperature": max(cfg.temperature, cfg.retry_temperature)}
      try:
        reply = await send_with_retries(self._client, pool, call, params, tries)
      except EndpointError as e:
        metrics.record(failed=True, failed_kind=e.budget_kind or failure_kind(e.kind), sent=tries.sent)
        self.last_error = f"{e.kind}: {e}"
        return Outcome(failed=True, error=f"{e.kind}: {e}", cause=e.kind, status=e.status, sent=tries.sent)
      try:
        value = call.parse(reply.text)
      except ReplyParseError as e:
        metrics.record(failure="unparseable_reply")
        error = f"unparseable_reply: {e}"
        continue
      self.cache.put(key, reply.text)  # under the original question's key: the next ask is free
      return Outcome(value)
    metrics.record(failed=True, failed_kind=failure_kind("unparseable_reply"))
    self.last_error = error
    return Outcome(failed=True, error=f"{error} (after {cfg.parse_attempts} asks)", cause="unparseable_reply")


# Fleets not closed yet. At interpreter exit (before threads are joined, so a reward thread blocked on a judgment is
# released instead of holding the exit) each is closed: in-flight judgments cancelled, client and loop closed.
_OPEN_FLEETS: "weakref.WeakSet[JudgeFleet]" = weakref.WeakSet()


def _close_open_fleets() -> None:
  for fleet in list(_OPEN_FLEETS):
    fleet.close()


try:
  # Threading's exit hooks run last-registered first, and concurrent.futures.thread (imported above) registered the
  # one that joins executor workers, so this runs before it: a reward worker blocked on a judgment is released.
  threading._register_atexit(_close_open_fleets)
except (AttributeError, RuntimeError):  # no such hook (other Pythons), or registered during shutdown
  atexit.register(_close_open_fleets)
