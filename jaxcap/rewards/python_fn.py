"""A reward that is a plain Python function of the captions and their records, no judge needed (as TRL takes a
reward function):

    # my_reward.py
    def score(captions, records, step):     # records: jaxcap.data.records.ImageRecord, one per caption
        return [min(len(c.split()), 200) / 200 for c in captions]

    --config.reward='{"fn": {"function": "my_reward:score"}}' --config.judge.kind=none

`function` is `module:function` (the module importable, e.g. from the working directory) or `path/to/file.py:
function`; `options` are keyword arguments passed on every call; `step` is passed when the function takes it (or
**kwargs). It returns one float per caption; None or NaN where it cannot score a caption: that caption's reward is
masked and counted (`judge_failures/fn`), never scored 0.
"""

from __future__ import annotations

import collections
import importlib
import importlib.util
import inspect
import math
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from jaxcap.data.records import ImageRecord, align_records
from jaxcap.rewards.batch import RewardBatch, make_batch
from jaxcap.rewards.families import reward_family


def load_function(spec: str, field: str = "reward.fn.function") -> Callable:
  """The function `spec` names: 'package.module:function' or 'path/to/file.py:function'."""
  module_name, _, attr = str(spec).rpartition(":")
  if not module_name or not attr:
    raise ValueError(f"{field}={spec!r}: write 'module:function' or 'path/to/file.py:function'")
  if module_name.endswith(".py"):
    path = Path(module_name).expanduser().resolve()
    if not path.is_file():
      raise ValueError(f"{field}={spec!r}: no file {path}")
    loader = importlib.util.spec_from_file_location(f"jaxcap_user_reward_{path.stem}", path)
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
  else:
    try:
      module = importlib.import_module(module_name)
    except ImportError as e:
      raise ValueError(
        f"{field}={spec!r}: cannot import {module_name!r} ({e}); run from the folder that holds it, add it to "
        "PYTHONPATH, or name the file: 'path/to/file.py:function'"
      ) from e
  fn = getattr(module, attr, None)
  if not callable(fn):
    raise ValueError(f"{field}={spec!r}: {module_name} has no function {attr!r}")
  return fn


def _takes(fn: Callable, name: str) -> bool:
  params = inspect.signature(fn).parameters.values()
  return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


class PythonReward:
  """Reward [N, 1] from `fn(captions, records, [step=], **options)`; masked where it returns None / NaN."""

  def __init__(self, fn: Callable, *, name: str, options: Mapping[str, Any] | None = None, label: str = ""):
    self.fn = fn
    self.names = (name,)
    self.options = dict(options or {})
    self.label = label or getattr(fn, "__name__", "fn")
    self._step = _takes(fn, "step")

  def __call__(self, captions: Sequence[str], records: Sequence[ImageRecord], *, step: int = 0) -> RewardBatch:
    records = align_records(captions, records)
    kwargs = {**self.options, **({"step": int(step)} if self._step else {})}
    out = self.fn(list(captions), list(records), **kwargs)
    scores = list(out) if not isinstance(out, np.ndarray) else out.reshape(-1).tolist()
    if len(scores) != len(captions):
      raise ValueError(
        f"reward function {self.label} returned {len(scores)} values for {len(captions)} captions; return one "
        "float (or None to mask it) per caption"
      )
    values = np.array([math.nan if s is None else float(s) for s in scores], np.float64)
    valid = np.isfinite(values)
    failed = collections.Counter({"fn": int((~valid).sum())})
    return make_batch(self.names, values[:, None], valid[:, None], [1.0], captions, records, failed)


@reward_family("fn", options=("function", "options", "name"), needs_judge=False)
def python_reward(
  judge, *, function: str = "", options: Mapping[str, Any] | None = None, name: str = ""
) -> PythonReward:
  """A plain Python reward function (module docstring); loaded now, so a bad name fails before any compute."""
  if not function:
    raise ValueError("reward.fn needs function='module:function' (or 'path/to/file.py:function')")
  fn = load_function(function)
  return PythonReward(fn, name=name or f"fn/{function.rpartition(':')[2]}", options=options, label=function)
