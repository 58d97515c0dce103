"""Named extension points: one `Registry` per kind of thing a config chooses by name.

Each extension point owns one registry next to its implementations (advantage estimators in
`jaxcap.rl.advantages`, reward families in `jaxcap.rewards.families`, judge kinds in `jaxcap.judges.factory`, ...),
and everything that needs the names (config validation, CLI help, tests) reads them from there:

    ADVANTAGE_ESTIMATORS = Registry("advantage estimator", field="rl.estimator")

    @ADVANTAGE_ESTIMATORS.register("grpo")
    def grpo_advantages(rewards, weights, valid=None): ...

    ADVANTAGE_ESTIMATORS["grpo"]   # the function; an unknown name raises a ValueError listing the known ones
"""

from __future__ import annotations

from typing import Generic, Iterator, Mapping, TypeVar

T = TypeVar("T")


class Registry(Mapping[str, T], Generic[T]):
  """An ordered name -> entry mapping, filled by a decorator at import time and read-only afterwards.

  `kind` names what the entries are and `field` the config field that chooses one (`reward.{name}` for a block
  keyed by name); both appear in error messages, so a wrong name is reported with the field and the known names.
  """

  def __init__(self, kind: str, *, field: str = ""):
    self.kind = kind
    self.field = field
    self._entries: dict[str, T] = {}

  def register(self, name: str, entry: T | None = None):
    """`@registry.register(name)` on a function or class, or `registry.register(name, entry)`."""
    if name in self._entries:
      raise ValueError(f"{self.kind} {name!r} is registered twice; pick another name.")

    def add(obj: T) -> T:
      self._entries[name] = obj
      return obj

    return add(entry) if entry is not None else add

  def __getitem__(self, name: str) -> T:
    try:
      return self._entries[name]
    except KeyError:
      if "{name}" in self.field:  # a block keyed by name, e.g. reward.{name}
        where = self.field.format(name=name)
      else:
        where = f"{self.field or self.kind}={name!r}"
      raise ValueError(f"{where}: unknown {self.kind}; choose one of {', '.join(self._entries)}") from None

  def __iter__(self) -> Iterator[str]:
    return iter(self._entries)

  def __len__(self) -> int:
    return len(self._entries)

  def __contains__(self, name: object) -> bool:
    return name in self._entries

  def names(self) -> tuple[str, ...]:
    return tuple(self._entries)

  def check(self, name: str) -> str | None:
    """None when `name` is registered, else the error message (for config validation)."""
    try:
      self[name]
    except ValueError as e:
      return str(e)
    return None

  def __repr__(self) -> str:
    return f"Registry({self.kind!r}: {', '.join(self._entries)})"


def describe(registries: Mapping[str, Registry]) -> str:
  """One line per registry, `key: name, name, ...`, for CLI help."""
  return "\n".join(f"  {key}: {', '.join(r)}" for key, r in registries.items())
