"""The evaluation report: a JSON document that round-trips (rendered by `jaxcap.eval.render`).

`EvalReport.to_json()` holds everything needed to re-render the report or re-bootstrap it: per-image
numerators/denominators of every atomic metric, per-image values of composites, caption lengths, the
estimates, failed-judgment counts and the red-team table. `jaxcap.eval.render` turns it into Markdown and plots
(`write_report`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

import numpy as np

from jaxcap.eval.metrics import Estimate, RatioMetric
from jaxcap.eval.redteam import RedTeamRow

FORMAT_VERSION = 1


def _nan_to_none(values) -> tuple[float | None, ...]:
  return tuple(None if v is None or not np.isfinite(v) else float(v) for v in values)


@dataclasses.dataclass(frozen=True)
class ModelEvaluation:
  """One captioner's results over the report's images [N]."""

  name: str
  samples_per_image: float
  lengths: tuple[int, ...]  # words of the first caption per image [N]
  metrics: Mapping[str, RatioMetric]  # atomic metrics, per-image num/den
  composite_values: Mapping[str, tuple[float | None, ...]]  # per-image composite values [N], None = masked
  estimates: Mapping[str, Estimate]
  failures: Mapping[str, int]  # judge primitive -> failed judgments (masked, not scored)

  def image_values(self, metric: str) -> np.ndarray:
    """Per-image values [N] of an atomic or composite metric, NaN where masked."""
    if metric in self.metrics:
      return self.metrics[metric].image_values
    if metric in self.composite_values:
      return np.array([np.nan if v is None else v for v in self.composite_values[metric]], float)
    raise KeyError(f"Model {self.name!r} has no metric {metric!r}; it has {sorted(self.estimates)}.")

  def to_json(self) -> dict[str, Any]:
    return {
      "name": self.name,
      "samples_per_image": self.samples_per_image,
      "lengths": list(self.lengths),
      "metrics": {k: {"num": list(m.num), "den": list(m.den)} for k, m in self.metrics.items()},
      "composite_values": {k: list(v) for k, v in self.composite_values.items()},
      "estimates": {k: dataclasses.asdict(e) for k, e in self.estimates.items()},
      "failures": dict(self.failures),
    }

  @classmethod
  def from_json(cls, row: Mapping[str, Any]) -> "ModelEvaluation":
    return cls(
      name=row["name"],
      samples_per_image=float(row["samples_per_image"]),
      lengths=tuple(int(x) for x in row["lengths"]),
      metrics={
        k: RatioMetric(tuple(map(float, m["num"])), tuple(map(float, m["den"]))) for k, m in row["metrics"].items()
      },
      composite_values={k: _nan_to_none(v) for k, v in row["composite_values"].items()},
      estimates={k: Estimate(**e) for k, e in row["estimates"].items()},
      failures={k: int(v) for k, v in row["failures"].items()},
    )


@dataclasses.dataclass(frozen=True)
class EvalReport:
  """Several captioners evaluated on the same images by the same judge, plus the red-team table."""

  image_ids: tuple[str, ...]
  judge: str
  models: tuple[ModelEvaluation, ...]
  headline: tuple[str, ...]  # metric columns of the main table, in order
  compared_to: str = ""  # the captioner `differences` are taken against ("" = none)
  differences: Mapping[str, Mapping[str, Estimate]] = dataclasses.field(default_factory=dict)  # model -> metric ->
  # (model - compared_to), paired bootstrap over images
  redteam: tuple[RedTeamRow, ...] = ()
  redteam_failures: Mapping[str, int] = dataclasses.field(default_factory=dict)
  settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # JSON-able run settings
  vqa_probe: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # jaxcap.eval.vqa_probe's document

  def model(self, name: str) -> ModelEvaluation:
    for m in self.models:
      if m.name == name:
        return m
    raise KeyError(f"No captioner {name!r} in the report; it has {[m.name for m in self.models]}.")

  def to_json(self) -> dict[str, Any]:
    return {
      "format_version": FORMAT_VERSION,
      "image_ids": list(self.image_ids),
      "judge": self.judge,
      "models": [m.to_json() for m in self.models],
      "headline": list(self.headline),
      "compared_to": self.compared_to,
      "differences": {m: {k: dataclasses.asdict(e) for k, e in d.items()} for m, d in self.differences.items()},
      "redteam": [dataclasses.asdict(r) for r in self.redteam],
      "redteam_failures": dict(self.redteam_failures),
      "settings": dict(self.settings),
      "vqa_probe": dict(self.vqa_probe),
    }

  @classmethod
  def from_json(cls, doc: Mapping[str, Any]) -> "EvalReport":
    if doc.get("format_version") != FORMAT_VERSION:
      raise ValueError(
        f"Report format_version {doc.get('format_version')!r}; this jaxcap reads "
        f"{FORMAT_VERSION}. Re-run `python -m jaxcap.eval` to regenerate it."
      )
    return cls(
      image_ids=tuple(doc["image_ids"]),
      judge=doc["judge"],
      models=tuple(ModelEvaluation.from_json(m) for m in doc["models"]),
      headline=tuple(doc["headline"]),
      compared_to=doc["compared_to"],
      differences={m: {k: Estimate(**e) for k, e in d.items()} for m, d in doc["differences"].items()},
      redteam=tuple(RedTeamRow(**r) for r in doc["redteam"]),
      redteam_failures={k: int(v) for k, v in doc["redteam_failures"].items()},
      settings=dict(doc["settings"]),
      vqa_probe=dict(doc.get("vqa_probe", {})),  # absent from reports written before the probe
    )

  def save(self, path: str | os.PathLike) -> None:
    with open(path, "w") as f:
      json.dump(self.to_json(), f, indent=1, allow_nan=False)

  @classmethod
  def load(cls, path: str | os.PathLike) -> "EvalReport":
    with open(path) as f:
      return cls.from_json(json.load(f))
