"""Metrics sinks: a JSONL log (the source of truth) mirrored to the experiment trackers (jaxcap.train.logs.trackers)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
import threading
import time
from typing import Callable, Mapping, Sequence

import jax
import numpy as np

from jaxcap.train.logs.trackers import open_trackers, scalars, warn


BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
_COMPILES = [0]  # XLA backend compiles in this process since the first `compiles()` call


def compiles() -> int:
  """XLA backend compiles so far in this process (every program, eager ops' included), counted from the first
  call (jax.monitoring's backend-compile event)."""
  if not hasattr(compiles, "listening"):
    compiles.listening = True
    jax.monitoring.register_event_duration_secs_listener(
      lambda event, *_, **__: _COMPILES.__setitem__(0, _COMPILES[0] + (event == BACKEND_COMPILE))
    )
  return _COMPILES[0]


def to_scalars(metrics: Mapping) -> dict[str, float]:
  """Flattens device/host metric values to floats; vector metrics become name/0, name/1, ..."""
  out = {}
  fetched = jax.device_get(dict(metrics))  # one transfer for all of them
  for k in metrics:  # in the caller's order (a pytree round trip sorts dict keys)
    v = np.asarray(fetched[k])
    if v.ndim == 0:
      out[k] = float(v)
    else:
      out.update({f"{k}/{i}": float(x) for i, x in enumerate(v.reshape(-1))})
  return out


# How a measured value that is not finite is logged: a JSON string, so it stays apart from null (= not measured)
# and every JSON parser reads it; float(v) turns it back into the number.
NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def measured(value: float) -> float | str:
  """A measured value as metrics.jsonl logs it: a finite float as is, NaN / +-infinity as 'nan' / 'inf' / '-inf'."""
  if math.isfinite(value):
    return value
  return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def is_number(value) -> bool:
  """Whether a logged value is a finite number (not null, not a NONFINITE string)."""
  return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class DeviceTimer:
  """The device time of a dispatched program, measured without making the host wait for it: a thread waits for
  the program's `inputs` (device values it reads that may still be being computed, e.g. the log-prob passes an
  update takes) and then its `outputs`, and notes when each became ready. `seconds()` is from the later of the
  dispatch (`dispatched`, perf_counter) and its inputs' readiness to its outputs' readiness; `done_at()` the
  latter. Both wait for the thread, which the loop asks only once it has waited for the program anyway (the next
  step's rollout needs its weights)."""

  def __init__(self, dispatched: float, outputs, inputs=()):
    self.dispatched, self.inputs_at, self.outputs_at = dispatched, dispatched, dispatched
    self._error: BaseException | None = None
    self._thread = threading.Thread(target=self._wait, args=(outputs, inputs), daemon=True, name="device-timer")
    self._thread.start()

  def _wait(self, outputs, inputs):
    try:
      jax.block_until_ready(inputs)
      self.inputs_at = time.perf_counter()
      jax.block_until_ready(outputs)
      self.outputs_at = time.perf_counter()
    except BaseException as e:  # the program failed: its own error surfaces where its outputs are fetched
      self._error = e

  def done_at(self) -> float:
    self._thread.join()
    return self.outputs_at

  def seconds(self) -> float:
    done = self.done_at()
    return float("nan") if self._error is not None else done - max(self.dispatched, self.inputs_at)


@dataclasses.dataclass
class PendingMetrics:
  """A step's metrics as the update left them: `device` values (jax arrays, possibly still being computed) and
  `host` floats. `result()` fetches the device values once and returns `to_scalars(device)` followed by `host`,
  the record the step logs. Device values are measured: a non-finite one is logged as such (`measured`); a host
  NaN is a value nobody measured (e.g. no valid judgment) and is logged as null."""

  device: Mapping
  host: Mapping[str, float] = dataclasses.field(default_factory=dict)
  timers: Mapping[str, DeviceTimer] = dataclasses.field(default_factory=dict)  # e.g. time/update_s: its seconds

  def result(self) -> dict[str, float]:
    out: dict = {k: measured(v) for k, v in to_scalars(self.device).items()}
    out.update(self.host)
    out.update({k: timer.seconds() for k, timer in self.timers.items()})
    return out


class StepLog:
  """A phase's step records, each written one step late: `defer` holds step t's PendingMetrics while step t+1 is
  dispatched, so fetching them never leaves the device idle; `flush` writes the held one (with its wall time,
  time/step_s, and time/compiles: the XLA compiles made between the previous step's `defer` and its own, i.e.
  while its rollout and update ran and dispatched) to `writer` and advances the progress bar. `check(phase, step, row) -> (row, error or None)` (the
  step guard, jaxcap.train.steps.guard) sees each record first; its error is raised once the record is written."""

  def __init__(
    self,
    writer: "MetricsWriter",
    phase: str,
    total: int,
    initial: int,
    enabled: bool = True,
    check: Callable[[str, int, dict], tuple[dict, BaseException | None]] | None = None,
  ):
    from tqdm.auto import tqdm

    self.writer, self.phase, self.check = writer, phase, check
    self.progress = tqdm(total=total, initial=initial, desc=phase, disable=not enabled, dynamic_ncols=True)
    self._pending: tuple[int, PendingMetrics, float, int] | None = None
    self._compiled = compiles()

  def defer(self, step: int, metrics: PendingMetrics, t0: float) -> None:
    """Holds step `step`'s metrics (started at perf_counter `t0`), writing the one held before (ended at `t0`)."""
    self.flush(end=t0)
    now = compiles()
    self._pending = (step, metrics, t0, now - self._compiled)
    self._compiled = now

  def flush(self, end: float | None = None) -> None:
    if self._pending is None:
      return
    step, metrics, t0, compiled = self._pending
    self._pending = None
    row = metrics.result()
    error = None
    if self.check is not None:
      row, error = self.check(self.phase, step + 1, row)
    row["time/step_s"] = (time.perf_counter() if end is None else end) - t0
    row["time/compiles"] = compiled
    self.writer.write(self.phase, step + 1, row)
    self.progress.update(1)
    shown = ("loss", "reward/mean", "length/mean")
    self.progress.set_postfix({k: f"{row[k]:.3f}" if is_number(row[k]) else str(row[k]) for k in shown if k in row})
    if error is not None:
      raise error

  def close(self) -> None:
    self.flush()
    self.progress.close()


class MetricsWriter:
  """Appends one JSON object per record to `metrics.jsonl` and mirrors scalars to the experiment trackers
  (jaxcap.train.logs.trackers; TensorBoard by default), process 0 only.

  Strict JSON: a value not measured (NaN, e.g. no valid judgment) is null, a measured non-finite one (`measured`)
  the string "nan", "inf" or "-inf"; neither reaches the trackers. TensorBoard is rebuilt from the log whenever
  records are dropped or replaced, so a resumed run never shows a step twice. An evaluation record (only `eval/`
  keys) logged again at the same (phase, step), as when a finished run is rerun, replaces the earlier one. A tracker
  that raises is dropped with one warning line; the log goes on."""

  def __init__(
    self,
    directory: str | Path,
    enabled: bool = True,
    trackers: Sequence[str] = ("tensorboard",),
    config: Mapping | None = None,
    **tracker_options,
  ):
    self.directory = Path(directory)
    self.enabled = enabled and jax.process_index() == 0
    self.path = self.directory / "metrics.jsonl"
    self.trackers: list = []
    self._evals: set[tuple[str, int]] | None = None  # (phase, step) of the logged eval records; None: not read yet
    if self.enabled:
      self.directory.mkdir(parents=True, exist_ok=True)
      self.trackers = open_trackers(list(trackers), self.directory, dict(config or {}), **tracker_options)

  def _each(self, method: str, *args) -> None:
    for t in list(self.trackers):
      try:
        getattr(t, method)(*args)
      except Exception as e:  # a mirror: never the run's end
        self.trackers.remove(t)
        warn(f"tracker {type(t).__name__} failed ({type(e).__name__}: {e}); dropped, metrics.jsonl goes on")

  def _rows(self) -> list[dict]:
    return read_metrics(self.path) if self.path.exists() else []

  def _rewrite(self, rows: list[dict]) -> None:
    """Replaces the log with `rows`; the trackers that can rebuild from them do (event files only append)."""
    self.path.write_text("".join(to_json(r) + "\n" for r in rows))
    self._evals = None
    self._each("replace", rows)

  def truncate_after(self, phase: str, step: int) -> None:
    """Drops records logged after a checkpoint (phase, step), so a resumed run does not log them twice."""
    if not (self.enabled and self.path.exists()):
      return
    order = {"vision": 0, "sft": 1, "rl": 2}
    rows = self._rows()
    keep = [r for r in rows if (order.get(r["phase"], 0), r["step"]) <= (order.get(phase, 0), step)]
    if len(keep) < len(rows):
      self._rewrite(keep)

  def reset(self) -> None:
    """Drops every record: a run with no checkpoint starts over."""
    if self.enabled and (self.path.exists() or (self.directory / "tensorboard").exists()):
      self._rewrite([])

  def write(self, phase: str, step: int, metrics: Mapping[str, float]) -> None:
    if not self.enabled:
      return
    record = {"phase": phase, "step": step, **metrics}
    if metrics and all(k.startswith("eval/") for k in metrics):
      if self._evals is None:
        self._evals = {(r["phase"], r["step"]) for r in self._rows() if _is_eval(r)}
      if (phase, step) in self._evals:  # the same evaluation measured again: one record, the latest
        self._rewrite([record if _is_eval(r) and (r["phase"], r["step"]) == (phase, step) else r for r in self._rows()])
        return
      self._evals.add((phase, step))
    with open(self.path, "a") as f:
      f.write(to_json(record) + "\n")
    self._each("log", phase, step, scalars(metrics))

  def log_rollouts(self, step: int, groups: list[dict]) -> None:
    """A rollout record file's groups (jaxcap.train.logs.rollout_records) as the trackers' tables."""
    if self.enabled:
      self._each("log_rollouts", step, groups)

  def close(self) -> None:
    self._each("close")
    self.trackers = []


def _is_eval(row: Mapping) -> bool:
  keys = [k for k in row if k not in ("phase", "step")]
  return bool(keys) and all(k.startswith("eval/") for k in keys)


def to_json(obj, **kw) -> str:
  """Strict JSON (summaries, checkpoint metadata, metric records): numpy scalars and arrays become numbers and
  lists, and NaN / infinity become null (a value that was not measured), never bare `NaN` that JSON parsers
  reject (a measured non-finite value is passed in as its NONFINITE string, `measured`)."""
  return json.dumps(_finite(obj), default=_jsonable, allow_nan=False, **kw)


def _finite(x):
  """`x` with every non-finite float replaced by None, recursively (numpy values converted first)."""
  if isinstance(x, (np.ndarray, np.generic)):
    x = x.tolist()
  if isinstance(x, float):
    return x if math.isfinite(x) else None
  if isinstance(x, Mapping):
    return {k: _finite(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_finite(v) for v in x]
  return x


def _jsonable(x):
  if isinstance(x, (np.integer, np.floating)):
    return x.item()
  if isinstance(x, np.ndarray):
    return x.tolist()
  raise TypeError(f"not JSON serialisable: {type(x)}")


def read_metrics(path: str | Path) -> list[dict]:
  return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
