"""One OpenAI-compatible server of a judge role, and the circuit breaker that tracks its health."""

from __future__ import annotations

import dataclasses
import os
import time


@dataclasses.dataclass(frozen=True)
class Endpoint:
  """An OpenAI-compatible base URL (e.g. "http://127.0.0.1:8000/v1").

  The API key is never stored here: `api_key_env` names the environment variable that holds it, read at
  request time, so keys stay out of configs, reprs and logs.
  """

  url: str
  api_key_env: str | None = None

  def __post_init__(self):
    if not self.url.startswith(("http://", "https://")):
      raise ValueError(
        f"Endpoint url {self.url!r} must start with http:// or https:// (e.g. http://127.0.0.1:8000/v1)."
      )

  @property
  def chat_url(self) -> str:
    base = self.url.rstrip("/")
    return base if base.endswith("/chat/completions") else base + "/chat/completions"

  @property
  def models_url(self) -> str:
    base = self.url.rstrip("/")
    return base.removesuffix("/chat/completions") + "/models"

  def headers(self) -> dict[str, str]:
    if not self.api_key_env:
      return {}
    key = os.environ.get(self.api_key_env)
    if not key:
      raise KeyError(
        f"Environment variable {self.api_key_env} (API key of endpoint {self.url}) is not set; "
        f"export {self.api_key_env}=<the key the server was started with> or set judge.api_key_env='' "
        "(--api-key-env '') for servers without auth."
      )
    return {"Authorization": f"Bearer {key}"}


class CircuitBreaker:
  """Closed -> open after `failure_threshold` consecutive failures; after `cooldown_s` one probe is let
  through (half-open): success closes it, failure reopens it for another cooldown.

  Keeps a dead or overloaded endpoint from eating every request's timeout while others are healthy.
  """

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

  @property
  def state(self) -> str:
    if self.opened_at is None:
      return "closed"
    return "half_open" if self._clock() - self.opened_at >= self.cooldown_s else "open"

  def allows(self) -> bool:
    """Whether a request may go to this endpoint now (half-open: only one probe at a time)."""
    state = self.state
    return state == "closed" or (state == "half_open" and not self.probing)

  def on_send(self) -> None:
    if self.state == "half_open":
      self.probing = True

  def on_success(self) -> None:
    self.consecutive_failures, self.opened_at, self.probing = 0, None, False

  def on_failure(self) -> None:
    self.consecutive_failures += 1
    was_probe, self.probing = self.probing, False
    if was_probe or self.consecutive_failures >= self.failure_threshold:
      if self.opened_at is None or was_probe:
        self.times_opened += self.opened_at is None
      self.opened_at = self._clock()
