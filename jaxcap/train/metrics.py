"""Metrics sinks: a JSONL log (the source of truth), TensorBoard event files, and PNG curves at the end."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Mapping

import jax
import numpy as np


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


@dataclasses.dataclass
class PendingMetrics:
  """A step's metrics as the update left them: `device` values (jax arrays, possibly still being computed) and
  `host` floats. `result()` fetches the device values once and returns `to_scalars(device)` followed by `host`,
  the record the step logs."""

  device: Mapping
  host: Mapping[str, float] = dataclasses.field(default_factory=dict)

  def result(self) -> dict[str, float]:
    out = to_scalars(self.device)
    out.update(self.host)
    return out


class MetricsWriter:
  """Appends one JSON object per record to `metrics.jsonl` and mirrors scalars to TensorBoard (process 0)."""

  def __init__(self, directory: str | Path, enabled: bool = True):
    self.directory = Path(directory)
    self.enabled = enabled and jax.process_index() == 0
    self.path = self.directory / "metrics.jsonl"
    self._tb = None
    if self.enabled:
      self.directory.mkdir(parents=True, exist_ok=True)
      try:
        from tensorboardX import SummaryWriter

        self._tb = SummaryWriter(str(self.directory / "tensorboard"))
      except ImportError:  # TensorBoard is optional; the JSONL log is complete without it
        self._tb = None

  def truncate_after(self, phase: str, step: int) -> None:
    """Drops records logged after a checkpoint (phase, step), so a resumed run does not log them twice."""
    if not (self.enabled and self.path.exists()):
      return
    order = {"vision": 0, "sft": 1, "rl": 2}
    keep = [
      line
      for line in self.path.read_text().splitlines()
      if line.strip()
      and (order.get(json.loads(line)["phase"], 0), json.loads(line)["step"]) <= (order.get(phase, 0), step)
    ]
    self.path.write_text("".join(line + "\n" for line in keep))

  def reset(self) -> None:
    """Drops every record: a run with no checkpoint starts over."""
    if self.enabled and self.path.exists():
      self.path.write_text("")

  def write(self, phase: str, step: int, metrics: Mapping[str, float]) -> None:
    if not self.enabled:
      return
    with open(self.path, "a") as f:
      f.write(json.dumps({"phase": phase, "step": step, **metrics}) + "\n")
    if self._tb is not None:
      for k, v in metrics.items():
        self._tb.add_scalar(f"{phase}/{k}", v, step)
      self._tb.flush()

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()


def to_json(obj, **kw) -> str:
  """json.dumps that also takes numpy scalars and arrays (summaries, checkpoint metadata)."""
  return json.dumps(obj, default=_jsonable, **kw)


def _jsonable(x):
  if isinstance(x, (np.integer, np.floating)):
    return x.item()
  if isinstance(x, np.ndarray):
    return x.tolist()
  raise TypeError(f"not JSON serialisable: {type(x)}")


def read_metrics(path: str | Path) -> list[dict]:
  return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def plot_curves(
  metrics_path: str | Path,
  out_png: str | Path,
  keys: tuple[str, ...] = ("reward/mean", "eval/qa_accuracy", "length/mean", "eval/length"),
) -> Path:
  """A PNG with one panel per key that was logged: value vs global step (RL steps continue after SFT's)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  rows = read_metrics(metrics_path)
  present = [k for k in keys if any(k in r for r in rows)]
  offset = {"sft": 0, "rl": max((r["step"] for r in rows if r["phase"] == "sft"), default=0)}
  fig, axes = plt.subplots(1, max(1, len(present)), figsize=(4 * max(1, len(present)), 3.2), squeeze=False)
  for ax, key in zip(axes[0], present):
    for phase, style in (("sft", "--"), ("rl", "-")):
      pts = [(r["step"] + offset[phase], r[key]) for r in rows if r["phase"] == phase and key in r]
      if pts:
        ax.plot(*zip(*pts), style, marker="o" if len(pts) < 30 else None, ms=3, label=phase)
    ax.set_title(key)
    ax.set_xlabel("global step")
    ax.legend()
  fig.tight_layout()
  fig.savefig(out_png, dpi=100)
  plt.close(fig)
  return Path(out_png)
