"""The schema's machinery. A config section is a frozen dataclass of `field()`s (a `Block`); each field carries its
default, a one-line doc, its validation and its resume policy:

    @dataclasses.dataclass(frozen=True)
    class Checkpoint(Block):
      RESUME = ALLOWED  # the policy of every field that names none
      every: int = field(25, "save every this many steps", ge=0, hint="0 = only at phase ends")

Validation: the field's type, then (only where its `when(block, run)` holds and its block is `active(run)`) its range
(`ge` / `gt` / `le` / `lt`) or `choices` (a tuple, or a `Registry`: for a dict field, of its keys), then the block's
`check(run, at)` for what involves more than one field. A message reads `path=value: rule (hint)`.

Resume policy (jaxcap.train.shell.resume): ALLOWED changes leave what is trained the same, ALTERS ones are refused on
resume unless resume_changes=allow, SHAPE ones change parameter shapes and are always refused.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import math
import typing
from typing import Any, Callable, ClassVar, Iterator

from jaxcap.registry import Registry

ALLOWED, ALTERS, SHAPE = "allowed", "alters", "shape"
POLICIES = (ALLOWED, ALTERS, SHAPE)


def field(
  default: Any = dataclasses.MISSING,
  doc: str = "",
  *,
  resume: str | None = None,
  ge: float | None = None,
  gt: float | None = None,
  le: float | None = None,
  lt: float | None = None,
  choices: tuple | Registry | None = None,
  rule: str = "",
  hint: str = "",
  when: Callable[[Any, Any], bool] | None = None,
):
  """One config field. `rule` replaces the generated rule text of a failed check, `hint` is appended to it in
  parentheses; `when(block, run)` limits the range / choice check to the runs where the field is used."""
  assert resume in (None, *POLICIES), resume
  meta = dict(doc=doc, resume=resume, ge=ge, gt=gt, le=le, lt=lt, choices=choices, rule=rule, hint=hint, when=when)
  if isinstance(default, (Block, dict, list)):  # a fresh copy per instance
    return dataclasses.field(default_factory=functools.partial(copy.deepcopy, default), metadata=meta)
  return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass(frozen=True)
class Block:
  """A section of the run config."""

  RESUME: ClassVar[str] = ALTERS  # the resume policy of the block's fields that declare none

  def active(self, run) -> bool:
    """Whether the ranges of this block's fields apply to `run` (e.g. the synthetic world's only without a
    manifest)."""
    return True

  def check(self, run, at: str) -> Iterator[str]:
    """Errors that involve more than one field; `at` is the block's path with a trailing dot ('rl.')."""
    return iter(())

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)


def is_block(tp) -> bool:
  return isinstance(tp, type) and issubclass(tp, Block)


@functools.cache
def hints(cls) -> dict[str, Any]:
  return typing.get_type_hints(cls)


def policy(f: dataclasses.Field, owner: type[Block]) -> str:
  return f.metadata.get("resume") or owner.RESUME


def lookup(root: type[Block], key: str) -> tuple[dataclasses.Field | None, type[Block]]:
  """(the field a dotted key names, the block declaring it); a key below a dict field (reward.caprl.preset,
  mesh.shape.fsdp) names that field. (None, the deepest block on the way) for a key the schema lacks."""
  owner, names = root, key.split(".")
  for i, name in enumerate(names):
    f = next((g for g in dataclasses.fields(owner) if g.name == name), None)
    if f is None:
      return None, owner
    if i == len(names) - 1 or not is_block(hints(owner)[name]):
      return f, owner
    owner = hints(owner)[name]
  raise AssertionError(key)


# -- building a block from a config's plain dict --------------------------------------------------------------


def _type_error(value, tp) -> str | None:
  """The fix when `value` does not have the type `tp` (int, float, str, bool, X | None, list[str], dict[...])."""
  if tp is Any:
    return None
  args = typing.get_args(tp)
  if type(None) in args:
    return None if value is None else _type_error(value, next(a for a in args if a is not type(None)))
  origin = typing.get_origin(tp) or tp
  if origin is bool:
    return None if isinstance(value, bool) else "must be True or False"
  if origin is int:
    return None if isinstance(value, int) and not isinstance(value, bool) else "must be an integer"
  if origin is float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok and not math.isfinite(value):  # lr=inf trains NaN; no field has a use for inf or nan
      return "must be a finite number"
    return None if ok else "must be a number"
  if origin is str:
    return None if isinstance(value, str) else "must be a string"
  if origin is list:
    ok = isinstance(value, (list, tuple)) and all(_type_error(v, args[0]) is None for v in value)
    return None if ok else f"must be a list of {args[0].__name__}"
  if origin is dict:
    ok = isinstance(value, dict) and (not args or all(_type_error(v, args[1]) is None for v in value.values()))
    return None if ok else "must be a block of fields" + (f" with {args[1].__name__} values" if args else "")
  raise TypeError(f"the config schema has no type check for {tp}")


def _nonfinite(value, path: str) -> Iterator[tuple[str, float]]:
  """(path, value) of every inf / nan float in a dict or list value, its keys joined to `path` with dots."""
  if isinstance(value, float) and not math.isfinite(value):
    yield path, value
  elif isinstance(value, dict):
    for k, v in value.items():
      yield from _nonfinite(v, f"{path}.{k}")
  elif isinstance(value, (list, tuple)):
    for i, v in enumerate(value):
      yield from _nonfinite(v, f"{path}[{i}]")


def _names(value, tp):
  """A list[str] field's value as a command line gives it: ml_collections overrides a tuple field only with a
  literal ("('a', 'b')") or repeated flags, and takes "a,b" or "(a, b)" as one name; split such names on commas."""
  if typing.get_origin(tp) is not list or typing.get_args(tp) != (str,) or not isinstance(value, (list, tuple)):
    return value
  if not any(isinstance(v, str) and "," in v for v in value):
    return value
  names = []
  for v in value:
    names += [n.strip(" '\"") for n in v.strip().strip("()[]").split(",")] if isinstance(v, str) else [v]
  return [n for n in names if n != ""]


def build(cls: type[Block], data: dict, at: str, errors: list[str], bad: set[str]) -> Block:
  """`cls` from `data` (one section of `ConfigDict.to_dict()`); unknown and missing keys and wrong types go to
  `errors` (their paths to `bad`), and such fields keep their defaults."""
  known = [f.name for f in dataclasses.fields(cls)]
  renamed = getattr(cls, "RENAMED", {})
  for key in data:
    if key in renamed and key not in known:
      errors.append(f"{at}{key}: renamed {at}{renamed[key]}; {renamed.get('?' + key, 'use the new name')}")
    elif key not in known:
      near = difflib.get_close_matches(key, known, n=3, cutoff=0.5)
      fix = f"did you mean {' or '.join(at + k for k in near)}?" if near else f"the fields are {', '.join(known)}"
      errors.append(f"{at}{key}: unknown field; {fix}")
  values = {}
  for f in dataclasses.fields(cls):
    path, tp = at + f.name, hints(cls)[f.name]
    if f.name in data:
      data = {**data, f.name: _names(data[f.name], tp)}
    if f.name not in data:
      default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
      has = default is not dataclasses.MISSING
      fix = f"add it (default {default.to_dict() if isinstance(default, Block) else default!r})" if has else "add it"
      errors.append(f"{path}: missing field; {fix}, or start the config from jaxcap.config_files.base_config()")
      bad.add(path)
    elif is_block(tp) and isinstance(data[f.name], dict):
      values[f.name] = build(tp, data[f.name], path + ".", errors, bad)
    elif is_block(tp) or _type_error(data[f.name], tp):
      fields = ", ".join(g.name for g in dataclasses.fields(tp)) if is_block(tp) else ""
      fix = f"must be a block with the fields {fields}" if is_block(tp) else _type_error(data[f.name], tp)
      errors.append(f"{path}={data[f.name]!r}: {fix}")
      bad.add(path)
    else:
      values[f.name] = data[f.name]
      for where, v in _nonfinite(data[f.name], path):  # inside dict / list fields (reward weights, options)
        errors.append(f"{where}={v!r}: must be a finite number")
        bad.add(path)
    if f.name not in values and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
      values[f.name] = data.get(f.name)  # a required field: the block is built, its checks are skipped (in `bad`)
  return cls(**values)


# -- ranges, choices and cross-field checks -------------------------------------------------------------------


def _bounds(m) -> str | None:
  lo = f"[{m['ge']}" if m["ge"] is not None else (f"({m['gt']}" if m["gt"] is not None else None)
  hi = f"{m['le']}]" if m["le"] is not None else (f"{m['lt']})" if m["lt"] is not None else None)
  if lo and hi:
    return f"must be in {lo}, {hi}"
  if m["ge"] is not None:
    return f"must be >= {m['ge']}"
  if m["gt"] is not None:
    return "must be positive" if m["gt"] == 0 else f"must exceed {m['gt']}"
  if m["le"] is not None:
    return f"must be <= {m['le']}"
  if m["lt"] is not None:
    return f"must be < {m['lt']}"
  return None


def _in_range(v, m) -> bool:
  return not (
    (m["ge"] is not None and v < m["ge"])
    or (m["gt"] is not None and v <= m["gt"])
    or (m["le"] is not None and v > m["le"])
    or (m["lt"] is not None and v >= m["lt"])
  )


def field_errors(path: str, value, m) -> list[str]:
  """The range / choice errors of one field's value (already of its type)."""
  choices = m["choices"]
  if isinstance(choices, Registry):  # its messages name the field (Registry.field) and the known names
    names = value if isinstance(value, dict) else [value]
    return [e for e in map(choices.check, names) if e is not None]
  hint = f" ({m['hint']})" if m["hint"] else ""
  if choices is not None and value not in choices:
    listed = ", ".join(choices[:-1]) + f" or {choices[-1]}" if len(choices) > 1 else choices[0]
    return [f"{path}={value!r}: {m['rule'] or 'use ' + listed}{hint}"]
  if value is not None and not isinstance(value, (str, bool, list, dict)) and not _in_range(value, m):
    return [f"{path}={value!r}: {m['rule'] or _bounds(m)}{hint}"]
  return []


def check_tree(block: Block, run: Block, at: str, errors: list[str], bad: set[str]) -> None:
  """Every field's range / choices, then every block's `check()`, depth first (`bad` fields and blocks with a bad
  field are skipped: their errors are reported already)."""
  active = block.active(run)
  for f in dataclasses.fields(block):
    path, value = at + f.name, getattr(block, f.name)
    if isinstance(value, Block):
      check_tree(value, run, path + ".", errors, bad)
    elif active and path not in bad and (f.metadata["when"] is None or f.metadata["when"](block, run)):
      errors.extend(field_errors(path, value, f.metadata))
  if active and not any(p.startswith(at) and "." not in p[len(at) :] for p in bad):
    errors.extend(block.check(run, at))


def docs(cls: type[Block], at: str = "") -> Iterator[tuple[str, str, str]]:
  """(path, resume policy, doc) of every leaf field, in declaration order (for --help and documentation)."""
  for f in dataclasses.fields(cls):
    tp = hints(cls)[f.name]
    if is_block(tp):
      yield from docs(tp, at + f.name + ".")
    else:
      yield at + f.name, policy(f, cls), f.metadata["doc"]
