"""The schema's entry points: the defaults, validation of a ConfigDict, the registries configs choose names from,
and each key's resume policy."""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxcap import fields
from jaxcap.config.cli import ConfigError
from jaxcap.fields import Block
from jaxcap.config.run import Run
from jaxcap.registry import Registry

# Every name a config chooses from, by the field that chooses it (validate() and the launcher's --help read these).
REGISTRIES: dict[str, Registry] = {}


def _registries(cls: type[Block], at: str = "") -> None:
  for f in dataclasses.fields(cls):
    tp = fields.hints(cls)[f.name]
    if fields.is_block(tp):
      _registries(tp, at + f.name + ".")
    elif isinstance(f.metadata["choices"], Registry):
      REGISTRIES[at + f.name] = f.metadata["choices"]


_registries(Run)


def defaults() -> dict:
  """The default run config as a plain nested dict."""
  return Run().to_dict()


def _typed(cls: type[Block], data: Any, at: str, checks: bool, standalone: bool = False) -> Block:
  """`cls` built from a ConfigDict / dict section at path `at`; with `checks` its ranges, choices and cross-field
  rules too (a `standalone` block, outside any run, is checked with run=None). Raises ConfigError listing every
  error."""
  data = data.to_dict() if hasattr(data, "to_dict") else dict(data or {})
  errors: list[str] = []
  bad: set[str] = set()
  built = fields.build(cls, data, at, errors, bad)
  if checks:
    fields.check_tree(built, None if standalone else built, at, errors, bad)
  if errors:
    raise ConfigError("invalid config:\n  - " + "\n  - ".join(errors))
  return built


def parse(config: Any) -> Run:
  """The typed run config from a ConfigDict (or its `to_dict()`), its structure checked (unknown and missing keys,
  types) but not its ranges and cross-field rules: for programs that only plan or inspect a config (jaxcap.plan)."""
  return _typed(Run, config, "", checks=False)


def validate(config: Any) -> Run:
  """The typed run config from a ConfigDict (or its `to_dict()`); raises ConfigError("invalid config: ...") listing
  every unknown or missing key, wrong type, out-of-range value and inconsistent pair of fields, each naming the
  field and the fix."""
  return _typed(Run, config, "", checks=True)


def block(cls: type[Block], data: Any, at: str) -> Block:
  """One typed block (e.g. an eval config's `judge`, at='judge.') from a ConfigDict or dict section, validated as
  `validate` validates a run's; fields the section leaves out take their defaults."""
  data = data.to_dict() if hasattr(data, "to_dict") else dict(data or {})
  return _typed(cls, {**cls().to_dict(), **data}, at, checks=True, standalone=True)


def replaced(block: fields.Block, changes: dict[str, Any]) -> fields.Block:
  """`block` with the fields of dotted keys replaced ({"model.lora.rank": 16}): a frozen config's variant."""
  for key, value in changes.items():
    head, _, rest = key.partition(".")
    value = replaced(getattr(block, head), {rest: value}) if rest else value
    block = dataclasses.replace(block, **{head: value})
  return block


def renamed_keys(cls: type[Block] = None, at: str = "") -> dict[str, str]:
  """Dotted old key -> new key of every field renamed (a block's `RENAMED`), e.g. to compare a saved config."""
  cls = cls or Run
  out = {f"{at}{old}": f"{at}{new}" for old, new in getattr(cls, "RENAMED", {}).items() if not old.startswith("?")}
  for f in dataclasses.fields(cls):
    tp = fields.hints(cls)[f.name]
    if fields.is_block(tp):
      out.update(renamed_keys(tp, f"{at}{f.name}."))
  return out


def resume_policy(key: str) -> str:
  """ALLOWED, ALTERS or SHAPE for a dotted key of a saved config: its field's policy (a key below a dict field,
  such as reward.caprl.preset, takes that field's; a whole block its block's); a key the schema lacks (a field
  since removed) takes the policy of the block it was in."""
  f, owner = fields.lookup(Run, key)
  if f is None:
    return owner.RESUME
  tp = fields.hints(owner)[f.name]
  return tp.RESUME if fields.is_block(tp) else fields.policy(f, owner)
