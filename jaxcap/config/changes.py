"""Differences between two saved run configs (`jaxcap.train.shell.resume.resolved()` dicts), leaf by leaf."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class Change:
  """One changed leaf: its dotted key, the old and the new value (ABSENT where a config lacks it)."""

  key: str
  old: Any
  new: Any
  why: str = ""  # for impossible changes: why the checkpoint cannot take it

  def __str__(self) -> str:
    return f"{self.key}: {fmt(self.old)} -> {fmt(self.new)}" + (f" ({self.why})" if self.why else "")


ABSENT = object()


def fmt(v) -> str:
  return "(absent)" if v is ABSENT else repr(v)


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
  """{'a': {'b': 1}} -> {'a.b': 1}; an empty dict stays a leaf."""
  out = {}
  for k, v in tree.items():
    key = f"{prefix}{k}"
    if isinstance(v, dict) and v:
      out.update(flatten(v, key + "."))
    else:
      out[key] = v
  return out


def diff(old: dict, new: dict, defaults: dict | None = None, renamed: dict | None = None) -> list[Change]:
  """Changed leaves between two `resolved()` dicts, sorted by key. A key the old config lacks is no change when the
  new value is its default in `defaults` (a field added to jaxcap since the run started); the old config's keys
  are read under their new names (`renamed`: old dotted key -> new)."""
  renamed = renamed or {}
  a = {**flatten(old.get("config", {})), **flatten({"runtime": old.get("runtime", {})})}
  a = {renamed.get(k, k): v for k, v in a.items()}
  b = {**flatten(new.get("config", {})), **flatten({"runtime": new.get("runtime", {})})}
  defaults = defaults or {}
  out = []
  for key in sorted(set(a) | set(b)):
    va, vb = a.get(key, ABSENT), b.get(key, ABSENT)
    if va == vb or (va is ABSENT and key in defaults and defaults[key] == vb):
      continue
    out.append(Change(key, va, vb))
  return out
