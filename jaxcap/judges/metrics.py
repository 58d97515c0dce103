"""Per-role judge metrics: requests, latency percentiles, failures by cause and failed judgments by kind, cache
hits, tokens."""

from __future__ import annotations

import collections
import threading

import numpy as np


class RoleMetrics:
  """Counters of one judge role. Mutated from the fleet's event loop, read from any thread."""

  def __init__(self, role: str):
    self.role = role
    self._lock = threading.Lock()
    self.judgments = 0  # judge calls asked for (one per request of a primitive)
    self.failed_judgments = 0  # judgments that ended failed after all retries (unsent ones included)
    self.unsent_judgments = 0  # failed judgments none of whose requests reached an endpoint (breakers open)
    self.hedges = 0  # second copies sent of requests not answered within the hedge delay
    self.requests = 0  # HTTP requests sent (retries included)
    self.cache_hits = 0
    self.failures: collections.Counter[str] = collections.Counter()  # cause -> count, per attempt
    # kind (chat_client.FAILURE_KINDS: auth, timeout, connection, http_status, parse, ...) -> failed judgments
    self.failed_by_kind: collections.Counter[str] = collections.Counter()
    self.endpoint_requests: collections.Counter[str] = collections.Counter()
    self.endpoint_failures: collections.Counter[str] = collections.Counter()
    self.latencies_s: list[float] = []  # successful requests only
    self.prompt_tokens = 0
    self.completion_tokens = 0
    self.in_flight = 0
    self.peak_in_flight = 0

  def record_request_start(self, url: str) -> None:
    with self._lock:
      self.requests += 1
      self.endpoint_requests[url] += 1
      self.in_flight += 1
      self.peak_in_flight = max(self.peak_in_flight, self.in_flight)

  def record_request_end(
    self,
    url: str,
    *,
    latency_s: float | None = None,
    failure: str | None = None,
    prompt_tokens: int = 0,
    completion_tokens: int = 0,
  ) -> None:
    with self._lock:
      self.in_flight -= 1
      if failure is not None:
        self.failures[failure] += 1
        # a copy abandoned because the other one answered (a hedge) is no failure of its endpoint
        self.endpoint_failures[url] += failure != "cancelled"
      else:
        self.latencies_s.append(latency_s or 0.0)
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens

  def record(
    self,
    *,
    judgment: bool = False,
    failed: bool = False,
    cache_hit: bool = False,
    failure: str | None = None,
    failed_kind: str = "other",
    sent: bool = True,
    hedge: bool = False,
  ) -> None:
    """`failed`: a judgment ended without a parsed reply, of kind `failed_kind` (`sent` False: none of its requests
    reached an endpoint); `failure`: one attempt's cause; `hedge`: a hedged copy was sent."""
    with self._lock:
      self.judgments += judgment
      self.failed_judgments += failed
      self.cache_hits += cache_hit
      self.hedges += hedge
      if failed and sent:
        self.failed_by_kind[failed_kind] += 1
      elif failed:
        self.unsent_judgments += 1
      if failure is not None:
        self.failures[failure] += 1

  def counts(self) -> tuple[int, int, dict[str, int]]:
    """(judgments tried, tried judgments failed, those by kind), cumulative: what the failure budget reads. A
    judgment that was never sent (`unsent_judgments`) is masked and counted there, not as a judge failure."""
    with self._lock:
      tried = self.judgments - self.unsent_judgments
      return tried, self.failed_judgments - self.unsent_judgments, dict(self.failed_by_kind)

  def snapshot(self) -> dict[str, float]:
    """Flat scalars for logging, keys "judge/<role>/<name>"; latencies in seconds."""
    with self._lock:
      lat = np.asarray(self.latencies_s, float)
      out = {
        "judgments": self.judgments,
        "failed_judgments": self.failed_judgments,
        "unsent_judgments": self.unsent_judgments,
        "hedges": self.hedges,
        "requests": self.requests,
        "cache_hits": self.cache_hits,
        "prompt_tokens": self.prompt_tokens,
        "completion_tokens": self.completion_tokens,
        "peak_in_flight": self.peak_in_flight,
      }
      for q in (50, 90, 99):
        out[f"latency_p{q}_s"] = float(np.percentile(lat, q)) if lat.size else float("nan")
      out.update({f"failures/{k}": v for k, v in sorted(self.failures.items())})
      out.update({f"failed/{k}": v for k, v in sorted(self.failed_by_kind.items())})
      return {f"judge/{self.role}/{k}": float(v) for k, v in out.items()}
