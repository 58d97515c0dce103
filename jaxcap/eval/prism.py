"""Prism-style evaluation: a fixed text-only judge answers each image's questions from the caption alone.

Questions are grouped into benchmarks by a question field (default `kind`); for n captions per image:
  prism/<benchmark>/mean@n  accuracy (%) over all (caption sample, question) answers of that benchmark
  prism/<benchmark>/best@n  accuracy (%) where a question counts as correct if any of the n captions got it
  prism/mean@n, prism/best@n  the mean over benchmarks (Prism reports the benchmark average)
With one caption per image best@n equals mean@n. A failed answer is masked: it drops out of mean@n, and a
question whose answers all failed drops out of best@n.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from jaxcap.eval.captioners import CaptionSet
from jaxcap.eval.metrics import RatioMetric, SuiteResult
from jaxcap.eval.questions import chosen_index, option_order, presented_options
from jaxcap.judges.protocol import Judge, MultipleChoiceRequest
from jaxcap.data.records import ImageRecord


@dataclasses.dataclass(frozen=True)
class PrismConfig:
  benchmark_field: str = "kind"  # MultipleChoiceQuestion attribute that names the benchmark
  shuffle_options: bool = True
  max_samples: int = 0  # captions per image to use; 0 = all the captioner provides
  seed: int = 0


def run_prism(
  judge: Judge, records: Sequence[ImageRecord], captions: CaptionSet, config: PrismConfig = PrismConfig()
) -> SuiteResult:
  """Prism metrics over `records` [N] for one captioner (see module docstring)."""
  benchmarks = sorted({str(getattr(q, config.benchmark_field)) for r in records for q in r.questions})
  requests, keys = [], []  # key: (image index, sample, question index)
  for i, record in enumerate(records):
    samples = captions.samples(record.id)
    samples = samples[: config.max_samples] if config.max_samples > 0 else samples
    for s, caption in enumerate(samples):
      for j, q in enumerate(record.questions):
        options, _ = presented_options(
          q, option_order(config.seed, record.id, q.id, len(q.options), config.shuffle_options)
        )
        requests.append(MultipleChoiceRequest(record.id, caption, q.question, options))
        keys.append((i, s, j))
  replies = judge.answer_multiple_choice(requests) if requests else []
  result = SuiteResult()
  # outcome[(i, j)] -> list of per-sample correctness for valid answers
  outcomes: dict[tuple[int, int], list[bool]] = {}
  for (i, s, j), request, reply in zip(keys, requests, replies):
    if reply.failed:
      result.count_failure("answer_multiple_choice")
      continue
    q = records[i].questions[j]
    gold = request.options.index(q.answer)
    outcomes.setdefault((i, j), []).append(chosen_index(reply.reply, request.options) == gold)
  n = len(records)
  for bench in benchmarks:
    mean_num, mean_den, best_num, best_den = (np.zeros(n) for _ in range(4))
    for (i, j), correct in outcomes.items():
      if str(getattr(records[i].questions[j], config.benchmark_field)) != bench:
        continue
      mean_num[i] += 100.0 * sum(correct)
      mean_den[i] += len(correct)
      best_num[i] += 100.0 * any(correct)
      best_den[i] += 1
    result.metrics[f"prism/{bench}/mean@n"] = RatioMetric.from_arrays(mean_num, mean_den)
    result.metrics[f"prism/{bench}/best@n"] = RatioMetric.from_arrays(best_num, best_den)
  for stat in ("mean@n", "best@n") if benchmarks else ():
    names = tuple(f"prism/{b}/{stat}" for b in benchmarks)
    result.composites[f"prism/{stat}"] = _benchmark_average(names)
  return result


def _benchmark_average(names: tuple[str, ...]):
  def average(values):
    return np.nanmean(np.stack([np.asarray(values[k], float) for k in names]), axis=0)

  return average
