"""Experiment trackers: mirrors of metrics.jsonl (the source of truth) in TensorBoard, Weights & Biases and MLflow,
chosen by `logging.trackers`. Each gets the same scalars (`{phase}/{key}` at the phase's step; values that were not
measured or not finite are left out), the run config, and the rollout records as tables.

    trackers = open_trackers(["tensorboard", "wandb"], workdir, config_dict, project="jaxcap", run_name="caprl")
    for t in trackers: t.log("rl", 3, {"loss": 0.2})

W&B follows its own settings (WANDB_MODE=offline writes <workdir>/wandb/ and touches no network); MLflow logs to
`logging.mlflow_uri`, else MLFLOW_TRACKING_URI, else its local file store file:<workdir>/mlruns. A resumed run goes
on in the same W&B / MLflow run (its id is kept in <workdir>/trackers/). TensorBoard's event files are rebuilt when
metrics.jsonl drops records (`replace`); W&B and MLflow cannot take records back, so the steps a resumed run
replays after its checkpoint appear there twice (with the same step). A tracker that fails to start, or later, is
one warning line and is dropped: the run and metrics.jsonl go on.
"""

from __future__ import annotations

import math
import os
import re
import secrets
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

INSTALL = "pip install 'jaxcap[tracking]'"


def warn(line: str) -> None:
  print(f"warning: {line}", file=sys.stderr, flush=True)


def scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
  """The values a tracker logs: finite numbers only (not null, not a non-finite 'nan' / 'inf' string)."""
  number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
  return {k: float(v) for k, v in metrics.items() if number(v)}


def rollout_table(groups: Sequence[Mapping]) -> tuple[list[str], list[list]]:
  """(columns, rows) of rollout record groups: one row per caption, its rewards one column per dimension."""
  names = list(groups[0]["reward_names"]) if groups else []
  columns = ["step", "record_id", "rank", "sample", "caption", "reward", "advantage", "tokens", "stop", *names]
  rows = []
  for group in groups:
    for j, s in enumerate(group["samples"]):
      head = [group["step"], group["record_id"], group["rank"], j, s["caption"], s["reward"], s["advantage"]]
      rows.append([*head, s["tokens"], s["stop"], *(s["rewards"].get(n) for n in names)])
  return columns, rows


def _run_id(workdir: Path, name: str, new_id) -> str:
  """The tracker's run id kept in <workdir>/trackers/<name>_run_id (`new_id()` the first time)."""
  path = workdir / "trackers" / f"{name}_run_id"
  if path.exists():
    return path.read_text().strip()
  path.parent.mkdir(parents=True, exist_ok=True)
  run_id = new_id()
  path.write_text(run_id)
  return run_id


class TensorBoard:
  """tensorboardX event files in <workdir>/tensorboard, rebuilt from the log when records are dropped."""

  def __init__(self, workdir: Path, config: Mapping, project: str, run_name: str):
    from tensorboardX import SummaryWriter

    self.directory = workdir / "tensorboard"
    self._open = lambda: SummaryWriter(str(self.directory))
    self.writer = self._open()

  def log(self, phase: str, step: int, values: Mapping[str, float], flush: bool = True) -> None:
    for k, v in values.items():
      self.writer.add_scalar(f"{phase}/{k}", v, step)
    if flush:
      self.writer.flush()

  def replace(self, rows: Sequence[Mapping]) -> None:
    self.writer.close()
    shutil.rmtree(self.directory, ignore_errors=True)
    self.writer = self._open()
    for r in rows:
      self.log(r["phase"], r["step"], scalars({k: v for k, v in r.items() if k not in ("phase", "step")}), False)
    self.writer.flush()

  def log_rollouts(self, step: int, groups: Sequence[Mapping]) -> None:
    pass  # no tables in TensorBoard: the rollout records are in <workdir>/rollouts for jaxcap.inspect

  def close(self) -> None:
    self.writer.close()


class WandB:
  """A W&B run (offline with WANDB_MODE=offline): scalars plotted against `{phase}/step`, rollouts as tables."""

  def __init__(self, workdir: Path, config: Mapping, project: str, run_name: str):
    import wandb

    run_id = _run_id(workdir, "wandb", lambda: secrets.token_hex(4))
    settings = wandb.Settings(console="off", silent=True)
    self.wandb = wandb
    self.run = wandb.init(
      project=project, name=run_name, id=run_id, resume="allow", dir=str(workdir), config=dict(config),
      settings=settings,
    )  # fmt: skip
    self._phases: set[str] = set()

  def log(self, phase: str, step: int, values: Mapping[str, float]) -> None:
    if phase not in self._phases:
      self.run.define_metric(f"{phase}/step")
      self.run.define_metric(f"{phase}/*", step_metric=f"{phase}/step")
      self._phases.add(phase)
    self.run.log({**{f"{phase}/{k}": v for k, v in values.items()}, f"{phase}/step": step})

  def replace(self, rows: Sequence[Mapping]) -> None:
    pass  # W&B cannot take logged points back (module docstring)

  def log_rollouts(self, step: int, groups: Sequence[Mapping]) -> None:
    columns, rows = rollout_table(groups)
    self.log("rl", step, {})  # keeps the phase's step metric defined
    self.run.log({"rl/rollouts": self.wandb.Table(columns=columns, data=rows), "rl/step": step})

  def close(self) -> None:
    self.run.finish()


_MLFLOW_KEY = re.compile(r"[^\w\-. /]")


def mlflow_key(phase: str, key: str) -> str:
  """`{phase}/{key}` with the key's slashes as dots: MLflow's file store keeps a metric per file under its key's
  path, so judge/failed and judge/failed/auth could not both be files."""
  return _MLFLOW_KEY.sub("_", f"{phase}/{key.replace('/', '.')}")


class MLflow:
  """An MLflow run: scalars at their step, the config as params (and config.json), rollouts as JSON tables."""

  def __init__(self, workdir: Path, config: Mapping, project: str, run_name: str, uri: str = ""):
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI", "") or (workdir / "mlruns").resolve().as_uri()
    if uri.startswith("file:"):  # MLflow 3 refuses its file store unless asked; a local run needs no database
      os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.entities import Param
    from mlflow.tracking import MlflowClient

    self.client = client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(project)
    exp_id = exp.experiment_id if exp is not None else client.create_experiment(project)
    self.run_id = _run_id(workdir, "mlflow", lambda: client.create_run(exp_id, run_name=run_name).info.run_id)
    flat = _flatten(config)
    params = [Param(_MLFLOW_KEY.sub("_", k), str(v)[:6000]) for k, v in flat.items()]
    logged = set(client.get_run(self.run_id).data.params)
    params = [p for p in params if p.key not in logged]  # a resumed run: params are logged once
    for i in range(0, len(params), 100):
      client.log_batch(self.run_id, params=params[i : i + 100])
    client.log_dict(self.run_id, dict(config), "config.json")

  def log(self, phase: str, step: int, values: Mapping[str, float]) -> None:
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    metrics = [Metric(mlflow_key(phase, k), v, now, step) for k, v in values.items()]
    for i in range(0, len(metrics), 1000):
      self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])

  def replace(self, rows: Sequence[Mapping]) -> None:
    pass  # MLflow keeps every logged point (module docstring)

  def log_rollouts(self, step: int, groups: Sequence[Mapping]) -> None:
    columns, rows = rollout_table(groups)
    self.client.log_dict(self.run_id, {"columns": columns, "data": rows}, f"rollouts/step_{step:06d}.json")

  def close(self) -> None:
    self.client.set_terminated(self.run_id)


TRACKERS = {"tensorboard": TensorBoard, "wandb": WandB, "mlflow": MLflow}


def _flatten(tree: Mapping, prefix: str = "") -> dict[str, Any]:
  out = {}
  for k, v in tree.items():
    if isinstance(v, Mapping) and v:
      out.update(_flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def open_trackers(
  names: Sequence[str], workdir: Path, config: Mapping, *, project: str = "jaxcap", run_name: str = "run",
  mlflow_uri: str = "",
) -> list:  # fmt: skip
  """The trackers named that start; each one that does not is a warning line naming why and the fix."""
  out = []
  for name in names:
    kwargs = {"uri": mlflow_uri} if name == "mlflow" else {}
    try:
      out.append(TRACKERS[name](Path(workdir), config, project, run_name, **kwargs))
    except ImportError as e:
      fix = INSTALL if name != "tensorboard" else "pip install tensorboardX"
      warn(f"tracker {name!r} is not installed ({e}); {fix}. The run goes on without it (metrics.jsonl is complete)")
    except Exception as e:  # a tracker is a mirror: it never costs the run
      warn(f"tracker {name!r} did not start ({type(e).__name__}: {e}); the run goes on without it")
  return out
