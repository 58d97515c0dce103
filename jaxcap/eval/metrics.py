"""Per-image metric values and bootstrap confidence intervals over images.

Every atomic metric is a ratio of per-image sums, value = sum_i num_i / sum_i den_i, so one representation
covers micro-averages (CaptionQA: num = summed question scores, den = questions answered) and per-image means
(DCScore: num = the image's score, den = 1). A masked image (all its judgments failed) has den_i = 0 and drops
out; it is never a score of 0. Composite metrics (Prism's mean over benchmarks, CapArena over baselines,
b-CapScore) are functions of atomic values, applied to bootstrap replicates elementwise.
Units: metrics are in percent (0-100; CapArena scores -100..100) as the papers report them.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Callable, Mapping

import numpy as np

Composite = Callable[[Mapping[str, np.ndarray]], np.ndarray]


@dataclasses.dataclass(frozen=True)
class RatioMetric:
  """Per-image numerator and denominator [N]; den 0 = masked image."""

  num: tuple[float, ...]
  den: tuple[float, ...]

  def __post_init__(self):
    if len(self.num) != len(self.den):
      raise ValueError(f"RatioMetric has {len(self.num)} numerators but {len(self.den)} denominators.")

  @classmethod
  def from_arrays(cls, num, den) -> "RatioMetric":
    return cls(tuple(float(x) for x in np.asarray(num, float)), tuple(float(x) for x in np.asarray(den, float)))

  @classmethod
  def per_image(cls, values, valid) -> "RatioMetric":
    """A per-image mean: values [N] where valid [N]."""
    valid = np.asarray(valid, bool)
    return cls.from_arrays(np.where(valid, np.asarray(values, float), 0.0), valid.astype(float))

  @property
  def value(self) -> float:
    den = sum(self.den)
    return sum(self.num) / den if den > 0 else float("nan")

  @property
  def image_values(self) -> np.ndarray:
    """Per-image ratio [N], NaN where masked."""
    num, den = np.asarray(self.num), np.asarray(self.den)
    return np.divide(num, den, out=np.full(len(num), np.nan), where=den > 0)

  @property
  def masked(self) -> int:
    return int(sum(d == 0 for d in self.den))


@dataclasses.dataclass(frozen=True)
class Estimate:
  """Point estimate with a percentile bootstrap interval; None where nothing valid was measured."""

  mean: float | None
  low: float | None
  high: float | None
  count: int  # images that contributed (den > 0); for composites, images with every input valid

  def format(self, digits: int = 1) -> str:
    if self.mean is None:
      return "n/a"
    if self.low is None or self.high is None:
      return f"{self.mean:.{digits}f}"
    return f"{self.mean:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


def _finite(x: float) -> float | None:
  return float(x) if np.isfinite(x) else None


def evaluate_composites(atomic: Mapping[str, np.ndarray], composites: Mapping[str, Composite]) -> dict[str, np.ndarray]:
  """Atomic values plus composites, in order (a composite may read earlier composites)."""
  values = dict(atomic)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices mean "nothing valid", kept as NaN
    for name, fn in composites.items():
      values[name] = np.asarray(fn(values), float)
  return values


def _ratio_values(
  metrics: Mapping[str, RatioMetric], composites: Mapping[str, Composite], index: np.ndarray | None
) -> dict[str, np.ndarray]:
  """Atomic ratios over the images in `index` ([B, N] resamples; None = all images) plus composites."""
  out = {}
  for k, m in metrics.items():
    num, den = np.asarray(m.num, float), np.asarray(m.den, float)
    if index is not None:
      num, den = num[index], den[index]
    s_num, s_den = num.sum(-1), den.sum(-1)
    out[k] = np.divide(s_num, s_den, out=np.full(np.shape(s_den), np.nan), where=s_den > 0)
  return evaluate_composites(out, composites)


def _num_images(*metric_sets: Mapping[str, RatioMetric]) -> int:
  lengths = {len(m.num) for metrics in metric_sets for m in metrics.values()}
  if len(lengths) > 1:
    raise ValueError(f"Metrics cover different numbers of images {sorted(lengths)}; evaluate them on the same images.")
  return lengths.pop() if lengths else 0


def _resample_index(n: int, num_resamples: int, seed: int) -> np.ndarray | None:
  """[num_resamples, n] image indices; the same for every captioner given (n, seed), so replicates pair up."""
  return np.random.default_rng(seed).integers(0, n, size=(num_resamples, n)) if num_resamples > 0 and n > 0 else None


def _interval(replicates: np.ndarray, confidence: float) -> tuple[float | None, float | None]:
  reps = replicates[np.isfinite(replicates)]
  if not len(reps):
    return None, None
  alpha = (1 - confidence) / 2
  lo, hi = np.quantile(reps, [alpha, 1 - alpha])
  return _finite(lo), _finite(hi)


def _check_confidence(confidence: float) -> None:
  if not 0 < confidence < 1:
    raise ValueError(f"confidence={confidence}: must be in (0, 1), e.g. 0.95.")


def bootstrap_estimates(
  metrics: Mapping[str, RatioMetric],
  composites: Mapping[str, Composite] = {},
  *,
  num_resamples: int = 1000,
  confidence: float = 0.95,
  seed: int = 0,
) -> dict[str, Estimate]:
  """Estimates of every atomic and composite metric; images resampled jointly across metrics (paired).

  num_resamples = 0 gives point estimates without intervals.
  """
  _check_confidence(confidence)
  n = _num_images(metrics)
  point = _ratio_values(metrics, composites, None)
  per_image = evaluate_composites({k: m.image_values for k, m in metrics.items()}, composites)
  counts = {k: int(np.isfinite(v).sum()) for k, v in per_image.items()}
  index = _resample_index(n, num_resamples, seed)
  replicates = _ratio_values(metrics, composites, index) if index is not None else {}
  return {
    k: Estimate(
      _finite(point[k]), *(_interval(replicates[k], confidence) if replicates else (None, None)), count=counts[k]
    )
    for k in point
  }


def bootstrap_differences(
  metrics: Mapping[str, RatioMetric],
  baseline: Mapping[str, RatioMetric],
  composites: Mapping[str, Composite] = {},
  *,
  num_resamples: int = 1000,
  confidence: float = 0.95,
  seed: int = 0,
) -> dict[str, Estimate]:
  """`metrics` minus `baseline` (two captioners on the same images), with a paired bootstrap interval."""
  _check_confidence(confidence)
  n = _num_images(metrics, baseline)
  shared = [k for k in metrics if k in baseline]
  mine = {k: metrics[k] for k in shared}
  theirs = {k: baseline[k] for k in shared}
  point_a, point_b = _ratio_values(mine, composites, None), _ratio_values(theirs, composites, None)
  valid_a = evaluate_composites({k: m.image_values for k, m in mine.items()}, composites)
  valid_b = evaluate_composites({k: m.image_values for k, m in theirs.items()}, composites)
  index = _resample_index(n, num_resamples, seed)
  reps = {}
  if index is not None:
    reps_a, reps_b = _ratio_values(mine, composites, index), _ratio_values(theirs, composites, index)
    reps = {k: reps_a[k] - reps_b[k] for k in reps_a}
  return {
    k: Estimate(
      _finite(point_a[k] - point_b[k]),
      *(_interval(reps[k], confidence) if reps else (None, None)),
      count=int((np.isfinite(valid_a[k]) & np.isfinite(valid_b[k])).sum()),
    )
    for k in point_a
  }


def harmonic_mean(*axes: np.ndarray) -> np.ndarray:
  """Elementwise harmonic mean of non-negative axes; 0 where any axis is 0, NaN where any is NaN."""
  stacked = np.stack([np.asarray(a, float) for a in axes])
  with np.errstate(divide="ignore", invalid="ignore"):
    out = len(axes) / np.sum(1.0 / stacked, axis=0)
  return np.where(np.any(stacked <= 0, axis=0) & ~np.any(np.isnan(stacked), axis=0), 0.0, out)


@dataclasses.dataclass
class SuiteResult:
  """What one suite measured for one captioner: atomic metrics, composites over them, failed judgments."""

  metrics: dict[str, RatioMetric] = dataclasses.field(default_factory=dict)
  composites: dict[str, Composite] = dataclasses.field(default_factory=dict)
  failures: dict[str, int] = dataclasses.field(default_factory=dict)

  def count_failure(self, primitive: str, count: int = 1) -> None:
    if count:
      self.failures[primitive] = self.failures.get(primitive, 0) + count

  def merge(self, other: "SuiteResult") -> "SuiteResult":
    clash = set(self.metrics) & set(other.metrics) | set(self.composites) & set(other.composites)
    if clash:
      raise ValueError(f"Two suites produced the metrics {sorted(clash)}; give them distinct names.")
    out = SuiteResult(dict(self.metrics) | other.metrics, dict(self.composites) | other.composites, dict(self.failures))
    for k, v in other.failures.items():
      out.count_failure(k, v)
    return out
