"""CaptionQA-style evaluation: caption-only question answering under word limits, with "cannot answer".

For each word limit L (the caption cut to its first L words; None = the whole caption) the judge answers
each question with options shuffled by a seed shared by all captioners; a "Cannot answer from the caption"
option is appended to every question that is not yes/no. Per question:
    correct -> 1,   cannot answer -> 1/n + 0.05 (n = the question's own options),   wrong or unparseable -> 0.
captionqa/w<L> (and captionqa/full) = 100 x the mean score over all answered questions. Failed answers are
masked and counted.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from jaxcap.eval.captioners import CaptionSet
from jaxcap.eval.metrics import RatioMetric, SuiteResult
from jaxcap.eval.questions import chosen_index, is_yes_no, option_order, presented_options, truncate_words
from jaxcap.judges.protocol import Judge, MultipleChoiceRequest
from jaxcap.data.records import ImageRecord

CANNOT_ANSWER = "Cannot answer from the caption"


@dataclasses.dataclass(frozen=True)
class CaptionQAConfig:
  word_limits: tuple[int, ...] = (50, 100, 200)
  include_unlimited: bool = True  # also score the whole caption as captionqa/full
  cannot_answer_option: str = CANNOT_ANSWER
  cannot_answer_bonus: float = 0.05
  seed: int = 0

  def __post_init__(self):
    if any(int(w) < 1 for w in self.word_limits):
      raise ValueError(f"CaptionQAConfig.word_limits={self.word_limits}: limits must be positive word counts.")

  @property
  def limits(self) -> tuple[int | None, ...]:
    return tuple(int(w) for w in self.word_limits) + ((None,) if self.include_unlimited else ())


def metric_name(limit: int | None) -> str:
  return "captionqa/full" if limit is None else f"captionqa/w{limit}"


def question_score(
  chosen: int | None, gold: int, cannot_index: int | None, num_options: int, bonus: float = 0.05
) -> float:
  """CaptionQA score of one answer: 1 correct, 1/n + bonus for "cannot answer", else 0."""
  if chosen is not None and chosen == gold:
    return 1.0
  if chosen is not None and cannot_index is not None and chosen == cannot_index:
    return 1.0 / num_options + bonus
  return 0.0


def run_captionqa(
  judge: Judge, records: Sequence[ImageRecord], captions: CaptionSet, config: CaptionQAConfig = CaptionQAConfig()
) -> SuiteResult:
  """CaptionQA metrics over `records` [N] for the first caption of each image."""
  unique: dict[MultipleChoiceRequest, int] = {}  # one judge call per distinct (caption cut, question)
  asked = []  # (limit, image index, request, gold, cannot index, n)
  for i, (record, caption) in enumerate(zip(records, captions.first(records))):
    for q in record.questions:
      options, gold = presented_options(q, option_order(config.seed, record.id, q.id, len(q.options)))
      cannot = None
      if not is_yes_no(q):
        options, cannot = options + (config.cannot_answer_option,), len(options)
      for limit in config.limits:
        request = MultipleChoiceRequest(record.id, truncate_words(caption, limit), q.question, options)
        unique.setdefault(request, len(unique))
        asked.append((limit, i, request, gold, cannot, len(q.options)))
  replies = judge.answer_multiple_choice(list(unique)) if unique else []
  result = SuiteResult()
  for reply in replies:
    result.count_failure("answer_multiple_choice", int(reply.failed))
  n = len(records)
  sums = {limit: (np.zeros(n), np.zeros(n)) for limit in config.limits}
  for limit, i, request, gold, cannot, num_options in asked:
    reply = replies[unique[request]]
    if reply.failed:
      continue
    score = question_score(
      chosen_index(reply.reply, request.options), gold, cannot, num_options, config.cannot_answer_bonus
    )
    sums[limit][0][i] += 100.0 * score
    sums[limit][1][i] += 1
  for limit, (num, den) in sums.items():
    result.metrics[metric_name(limit)] = RatioMetric.from_arrays(num, den)
  return result
