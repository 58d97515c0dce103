"""Judge replies cached by (prompt, sampling params): a repeated question costs no request."""

from __future__ import annotations

import collections
import hashlib
import json
import threading
from typing import Any, Mapping, Sequence


def cache_key(messages: Sequence[Mapping[str, Any]], sampling: Mapping[str, Any]) -> str:
  """sha256 of the canonical JSON of the messages and every sampling parameter (model included)."""
  canonical = json.dumps(
    {"messages": list(messages), "sampling": dict(sampling)}, sort_keys=True, separators=(",", ":"), ensure_ascii=False
  )
  return hashlib.sha256(canonical.encode()).hexdigest()


class ReplyCache:
  """LRU map key -> reply text, at most `max_entries` (0 disables caching). Only parsed replies are stored."""

  def __init__(self, max_entries: int = 100_000):
    self.max_entries = max_entries
    self._entries: collections.OrderedDict[str, str] = collections.OrderedDict()
    self._lock = threading.Lock()

  def get(self, key: str) -> str | None:
    with self._lock:
      text = self._entries.get(key)
      if text is not None:
        self._entries.move_to_end(key)
      return text

  def put(self, key: str, text: str) -> None:
    if self.max_entries <= 0:
      return
    with self._lock:
      self._entries[key] = text
      self._entries.move_to_end(key)
      while len(self._entries) > self.max_entries:
        self._entries.popitem(last=False)

  def __len__(self) -> int:
    return len(self._entries)
