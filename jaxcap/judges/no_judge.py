"""`judge.kind='none'`: the judge of a run whose rewards need none (rule rewards, a Python reward function). Every
primitive raises, naming what asked; the run config's validation keeps judge-based rewards out of such a run."""

from __future__ import annotations

from typing import Sequence


class NoJudgeError(RuntimeError):
  """A judge primitive was called in a run configured without a judge."""


class NoJudge:
  """Implements `jaxcap.judges.protocol.Judge`; any call is an error (module docstring)."""

  def _refuse(self, primitive: str, requests: Sequence) -> list:
    if not requests:
      return []
    raise NoJudgeError(
      f"{primitive} was asked for {len(requests)} judgment(s) but judge.kind='none': set judge.kind='http' (with "
      "judge.endpoints) or use rewards that need no judge (timestamp_format, caption_length, fn)"
    )

  def answer_multiple_choice(self, requests):
    return self._refuse("answer_multiple_choice", requests)

  def check_criteria(self, requests):
    return self._refuse("check_criteria", requests)

  def split_claims(self, requests):
    return self._refuse("split_claims", requests)

  def verify_claims(self, requests):
    return self._refuse("verify_claims", requests)

  def match_reference_units(self, requests):
    return self._refuse("match_reference_units", requests)

  def rate_language(self, requests):
    return self._refuse("rate_language", requests)

  def compare_captions(self, requests):
    return self._refuse("compare_captions", requests)

  def score_likert(self, requests):
    return self._refuse("score_likert", requests)

  def write_criteria(self, requests):
    return self._refuse("write_criteria", requests)
