"""Experiment trackers: mirrors of metrics.jsonl (the source of truth) in TensorBoard, Weights & Biases and MLflow,
chosen by `logging.trackers`. Each gets the same scalars (`tracker_key`: `{phase}/{key}`, a key already named by its
phase, `vision/colour_acc`, as is; at the phase's own step, as metrics.jsonl counts it; values that were not
measured or not finite are left out), the run config, and the rollout records as tables with each caption's
image, prompt, reference and the judge's evidence (jaxcap.train.logs.rollout_tables).

    trackers = open_trackers(["tensorboard", "wandb"], workdir, config_dict, project="jaxcap", run_name="caprl")
    for t in trackers: t.log("rl", 3, {"loss": 0.2})

W&B follows its own settings (WANDB_MODE=offline writes <workdir>/wandb/ and touches no network); MLflow logs to
`logging.mlflow_uri`, else MLFLOW_TRACKING_URI, else a local SQLite store, sqlite:///<workdir>/mlflow.db with its
artifacts in <workdir>/mlartifacts (MLflow 3 refuses to read its file store without MLFLOW_ALLOW_FILE_STORE;
`mlflow ui --backend-store-uri sqlite:///<workdir>/mlflow.db` shows the run). A resumed run goes
on in the same W&B / MLflow run (its id is kept in <workdir>/trackers/). TensorBoard's event files are rebuilt when
metrics.jsonl drops records (`replace`); W&B and MLflow cannot take records back, so the steps a resumed run
replays after its checkpoint appear there twice (with the same step). A tracker that fails to start, or later, is
one warning line and is dropped: the run and metrics.jsonl go on.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import secrets
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from jaxcap.train.logs.rollout_tables import rollout_table

INSTALL = "pip install 'jaxcap[tracking]'"


def warn(line: str) -> None:
  print(f"warning: {line}", file=sys.stderr, flush=True)


def scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
  """The values a tracker logs: finite numbers only (not null, not a non-finite 'nan' / 'inf' string)."""
  number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
  return {k: float(v) for k, v in metrics.items() if number(v)}


def tracker_key(phase: str, key: str) -> str:
  """The name a tracker logs `key` of `phase` under: `{phase}/{key}`, or `key` when it already starts with the
  phase's name (the vision warm-up's `vision/colour_acc`, not `vision/vision/colour_acc`)."""
  return key if key.startswith(f"{phase}/") else f"{phase}/{key}"


def _media(groups: Sequence[Mapping], workdir: Path) -> dict[str, Path]:
  """media path as recorded -> the file, for the groups' images that exist (relative paths: under the workdir)."""
  out = {}
  for g in groups:
    path = Path(g.get("media") or "")
    path = path if path.is_absolute() else workdir / path
    if g.get("media") and path.is_file():
      out[g["media"]] = path
  return out


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
      self.writer.add_scalar(tracker_key(phase, k), v, step)
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
    self.wandb, self.workdir = wandb, workdir
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
    self.run.log({**{tracker_key(phase, k): v for k, v in values.items()}, f"{phase}/step": step})

  def replace(self, rows: Sequence[Mapping]) -> None:
    pass  # W&B cannot take logged points back (module docstring)

  def log_rollouts(self, step: int, groups: Sequence[Mapping]) -> None:
    columns, rows = rollout_table(groups)
    media, image = _media(groups, self.workdir), columns.index("image")
    images = {m: self.wandb.Image(str(p)) for m, p in media.items()}
    rows = [[*r[:image], images.get(r[image]), *r[image + 1 :]] for r in rows]  # the image itself, not its path
    self.log("rl", step, {})  # keeps the phase's step metric defined
    self.run.log({"rl/rollouts": self.wandb.Table(columns=columns, data=rows), "rl/step": step})

  def close(self) -> None:
    self.run.finish()


_MLFLOW_KEY = re.compile(r"[^\w\-. /]")


def mlflow_key(phase: str, key: str, file_store: bool = False) -> str:
  """`tracker_key(phase, key)`, characters MLflow rejects as `_`; in a file store (a `file:` or plain path URI)
  the slashes past the phase are dots: it keeps a metric per file under its key's path, so judge/failed and
  judge/failed/auth could not both be files."""
  name = tracker_key(phase, key)
  if file_store:
    head, _, tail = name.partition("/")
    name = f"{head}/{tail.replace('/', '.')}"
  return _MLFLOW_KEY.sub("_", name)


def default_mlflow_uri(workdir: Path) -> str:
  """The local store a run logs to when given none: SQLite in the workdir (MLflow 3 refuses to read its file
  store unless MLFLOW_ALLOW_FILE_STORE is set; `mlflow ui` reads this one as it is)."""
  return f"sqlite:///{(workdir / 'mlflow.db').resolve()}"


class MLflow:
  """An MLflow run: scalars at their step, the config as params (and config.json), rollouts as JSON tables with
  their images as artifacts."""

  def __init__(self, workdir: Path, config: Mapping, project: str, run_name: str, uri: str = ""):
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI", "") or default_mlflow_uri(workdir)
    self.file_store = uri.startswith("file:") or "://" not in uri
    if self.file_store:  # asked for by name: MLflow 3 writes one only when allowed (reading it needs the same)
      os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    if uri.startswith("sqlite:") and importlib.util.find_spec("sqlalchemy") is None:
      raise ImportError("MLflow's SQLite store needs SQLAlchemy, which mlflow-skinny lacks (the tracking extra has it)")
    from mlflow.entities import Param
    from mlflow.tracking import MlflowClient

    self.workdir = workdir
    self.client = client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(project)
    # a store of this run's own keeps its artifacts beside it (MLflow's default is ./mlruns under the current dir)
    location = (workdir / "mlartifacts").resolve().as_uri() if uri == default_mlflow_uri(workdir) else None
    exp_id = exp.experiment_id if exp is not None else client.create_experiment(project, artifact_location=location)
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
    metrics = [Metric(mlflow_key(phase, k, self.file_store), v, now, step) for k, v in values.items()]
    for i in range(0, len(metrics), 1000):
      self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])

  def replace(self, rows: Sequence[Mapping]) -> None:
    pass  # MLflow keeps every logged point (module docstring)

  def log_rollouts(self, step: int, groups: Sequence[Mapping]) -> None:
    """The table as artifact rollouts/step_XXXXXX.json, its "image" column the image's artifact path
    (rollouts/media/<file name>, logged once)."""
    columns, rows = rollout_table(groups)
    image, logged = columns.index("image"), {}
    for media, path in _media(groups, self.workdir).items():
      self.client.log_artifact(self.run_id, str(path), "rollouts/media")
      logged[media] = f"rollouts/media/{path.name}"
    rows = [[*r[:image], logged.get(r[image], ""), *r[image + 1 :]] for r in rows]
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
