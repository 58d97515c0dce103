"""The endpoints of one judge role with their breakers, the role's concurrency bound and metrics (event-loop side
of `JudgeFleet`), and how a request gets an endpoint: `acquire` waits while every breaker is open, until one
lets a probe through, instead of failing the requests that were never sent."""

from __future__ import annotations

import asyncio

from jaxcap.judges.breaker import CircuitBreaker
from jaxcap.judges.chat_client import EndpointError, failure_kind
from jaxcap.judges.endpoint import Endpoint
from jaxcap.judges.metrics import RoleMetrics
from jaxcap.judges.roles import RoleConfig

NOT_SENT = "all_endpoints_open"  # the cause of a request no endpoint would take


class EndpointState:
  """One endpoint of a role: its breaker, requests in flight, whether it reads the request copy."""

  def __init__(self, endpoint: Endpoint, config: RoleConfig):
    self.endpoint = endpoint
    self.breaker = CircuitBreaker(config.breaker_failures, config.breaker_cooldown_s)
    self.outstanding = 0
    self.hint: bool | None = {"always": True, "never": False}.get(config.request_hint)  # None: ask GET /models
    self.last_failure = ""  # cause of the last retryable failure (what opens the breaker)
    self.probe: asyncio.Lock | None = None  # created inside the loop


class RolePool:
  """Endpoints of one role with their breakers, the role's semaphore and metrics. `start` runs inside the loop."""

  def __init__(self, role: str, config: RoleConfig):
    self.role = role
    self.config = config
    self.endpoints = [EndpointState(e, config) for e in config.endpoints]
    self.metrics = RoleMetrics(role)
    self.semaphore: asyncio.Semaphore | None = None
    self._changed: asyncio.Event | None = None

  def start(self) -> None:
    self.semaphore = asyncio.Semaphore(self.config.max_concurrency)
    self._changed = asyncio.Event()
    for state in self.endpoints:
      state.probe = asyncio.Lock()

  def changed(self) -> None:
    """Wakes the requests waiting in `acquire` (a breaker's state changed)."""
    assert self._changed is not None
    self._changed.set()
    self._changed = asyncio.Event()

  def pick(self, avoid: EndpointState | None = None) -> EndpointState | None:
    """The allowed endpoint with the fewest outstanding requests, other than `avoid` when there is another (ties:
    configuration order); None when every breaker is open."""
    allowed = [e for e in self.endpoints if e.breaker.allows()]
    preferred = [e for e in allowed if e is not avoid] or allowed
    return min(preferred, key=lambda e: e.outstanding) if preferred else None

  async def acquire(self, avoid: EndpointState | None = None) -> EndpointState:
    """An endpoint for one request (see `pick`). While every breaker is open the request waits, for the cooldown
    and the probe after it; when every endpoint's probe has failed since it began waiting, it is not sent:
    EndpointError(NOT_SENT), final, counted under what opened the breakers."""
    probes = [e.breaker.probe_failures for e in self.endpoints]
    while True:
      state = self.pick(avoid)
      if state is not None:
        return state
      if all(e.breaker.probe_failures > n for e, n in zip(self.endpoints, probes)):
        raise self._not_sent()
      assert self._changed is not None
      changed = self._changed
      wait = [e.breaker.seconds_to_half_open() for e in self.endpoints if e.breaker.state == "open"]
      try:  # until a cooldown ends, or a probe's outcome (a half-open breaker's probe is bounded by timeout_s)
        await asyncio.wait_for(changed.wait(), timeout=min(wait) + 1e-3 if wait else None)
      except asyncio.TimeoutError:
        pass

  def _not_sent(self) -> EndpointError:
    causes = sorted({e.last_failure for e in self.endpoints if e.last_failure})
    error = EndpointError(
      NOT_SENT,
      f"role {self.role!r}: not sent, every endpoint's circuit breaker stayed open through a probe "
      f"({[e.endpoint.url for e in self.endpoints]}; they failed with {', '.join(causes) or 'errors'})",
      retryable=False,
    )
    # counted under what opened the breakers (e.g. timeout), not as a kind of its own
    error.budget_kind = failure_kind(causes[0]) if len(causes) == 1 else "connection"
    return error
