"""The circuit breaker of one judge endpoint: closed -> open when the endpoint stops answering, half-open after a
cooldown (one probe goes through), closed again when the probe is answered.

A request that fails (a timeout, a refused connection, a 5xx) counts towards opening only when the endpoint has
answered nothing since that request was sent: a request that timed out while later ones were answered was slow
itself, and says nothing about the endpoint's health. So a server that answers 70% of requests at once and 30%
too late stays closed, and a dead or hung one opens after `failure_threshold` failures.
"""

from __future__ import annotations

import dataclasses
import math
import time


@dataclasses.dataclass(frozen=True)
class Send:
  """One request's ticket: when it was sent (breaker clock) and whether it is the half-open probe."""

  at: float
  probe: bool


class CircuitBreaker:
  """Closed -> open after `failure_threshold` failures counted as above; after `cooldown_s` one probe is let
  through (half-open): an answer closes it, a failure reopens it for another cooldown (`probe_failures` counts
  those, for callers waiting on a probe's outcome)."""

  def __init__(self, failure_threshold: int = 3, cooldown_s: float = 5.0, clock=time.monotonic):
    if failure_threshold < 1:
      raise ValueError(f"failure_threshold={failure_threshold}: must be >= 1.")
    self.failure_threshold = failure_threshold
    self.cooldown_s = cooldown_s
    self._clock = clock
    self.consecutive_failures = 0
    self.opened_at: float | None = None
    self.probing = False
    self.times_opened = 0
    self.probe_failures = 0
    self.answered_at = -math.inf  # when the endpoint last answered a request

  @property
  def state(self) -> str:
    if self.opened_at is None:
      return "closed"
    return "half_open" if self._clock() - self.opened_at >= self.cooldown_s else "open"

  def allows(self) -> bool:
    """Whether a request may go to this endpoint now (half-open: only one probe at a time)."""
    state = self.state
    return state == "closed" or (state == "half_open" and not self.probing)

  def seconds_to_half_open(self) -> float:
    """Seconds until an open breaker lets a probe through (0 when it is not open)."""
    if self.opened_at is None:
      return 0.0
    return max(0.0, self.opened_at + self.cooldown_s - self._clock())

  def on_send(self) -> Send:
    probe = self.state == "half_open"
    self.probing = self.probing or probe
    return Send(self._clock(), probe)

  def on_success(self, send: Send | None = None) -> None:
    self.consecutive_failures, self.opened_at, self.probing = 0, None, False
    self.answered_at = self._clock()

  def on_failure(self, send: Send | None = None) -> None:
    probe = self.probing if send is None else send.probe
    if probe:
      self.probing = False
      self.probe_failures += 1
      self.times_opened += self.opened_at is None
      self.opened_at = self._clock()
      return
    if send is not None and self.answered_at >= send.at:
      return  # answered since this request went out: the request was slow, the endpoint is alive
    self.consecutive_failures += 1
    if self.consecutive_failures >= self.failure_threshold and self.opened_at is None:
      self.times_opened += 1
      self.opened_at = self._clock()

  def on_cancel(self, send: Send | None = None) -> None:
    """A request abandoned by its caller (a hedge won): no verdict on the endpoint; a cancelled probe frees the
    half-open slot for the next one."""
    if send is None or send.probe:
      self.probing = False
