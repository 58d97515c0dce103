"""The judge protocol over HTTP: every primitive renders its prompt, asks the fleet, parses the reply.

Primitive -> role (a role that is not configured falls back to the fleet's fallback role):
  answer_multiple_choice        "answerer"   CapRL's text-only answerer (caption only)
  check_criteria                "judge"      RubiCap's criterion judge
  write_criteria                "rubric_writer"
  split_claims, match_reference_units, rate_language   "judge"
  verify_claims                 "verifier"   BalCapRL's MLLM (image attached when the role sends images)
  score_likert, compare_captions "judge"     (image attached for Direct-Likert / pairwise when sent)
  answer_visual_questions       "curator"    CapRL QA curation VLM (with / without the image)
A judgment the fleet could not obtain or parse comes back `failed=True` with the cause; `failures_by_kind()`
counts them by kind (auth, timeout, connection, http_status, parse, image).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, Sequence

from jaxcap.judges import parsing
from jaxcap.judges.answerer import Answerer
from jaxcap.judges.fleet import Outcome
from jaxcap.judges.prompted_fleet import PromptedFleet, images_from_records
from jaxcap.judges.protocol import (
  CaptionRequest,
  ClaimSplit,
  ClaimVerdicts,
  ClaimVerificationRequest,
  Coverage,
  CoverageRequest,
  CriteriaWritingRequest,
  CriterionRequest,
  CriterionVerdict,
  LanguageRatings,
  LikertRequest,
  LikertScore,
  MultipleChoiceReply,
  MultipleChoiceRequest,
  PairwiseRequest,
  PairwiseVerdict,
  VisualQuestionRequest,
  WrittenCriteria,
)
from jaxcap.data.records import Criterion

__all__ = ["HttpJudge", "images_from_records"]


class HttpJudge(PromptedFleet):
  """Implements `jaxcap.judges.protocol.Judge` against a `JudgeFleet` (see `PromptedFleet` for the arguments);
  `answerer`: how CapRL's answerer is asked (`jaxcap.judges.answerer.Answerer`; default: its defaults)."""

  def __init__(self, fleet, *, answerer: Answerer | None = None, **kwargs):
    super().__init__(fleet, **kwargs)
    self.answerer = answerer or Answerer()

  # -- CapRL ----------------------------------------------------------------------------------------------

  def answer_multiple_choice(self, requests: Sequence[MultipleChoiceRequest]) -> list[MultipleChoiceReply]:
    """The reply is the parsed option label ("B"), so either CapRL parsing mode reads it; with
    answerer.no_letter='wrong', '' for an answer naming none (scored wrong, as released), else re-asked."""
    a = self.answerer
    by_template: dict[str, list[int]] = {}
    for i, r in enumerate(requests):
      by_template.setdefault(a.video_template if r.media == "video" and a.video_template else a.template, []).append(i)
    outcomes: list = [None] * len(requests)
    for template, picked in by_template.items():
      items = []
      for i in picked:
        r = requests[i]
        labels = r.option_labels()
        parse = (
          parsing.first_letter
          if a.no_letter == "wrong"
          else functools.partial(parsing.parse_letter, options=r.options, labels=labels)
        )
        items.append((r, dict(caption=r.caption, question=r.question, options=list(r.options), labels=labels), parse))
      for i, o in zip(picked, self._ask("answer_multiple_choice", template, items)):
        outcomes[i] = _too_many_options(requests[i]) or o
    return self._results(outcomes, lambda v: MultipleChoiceReply(reply=v), MultipleChoiceReply)

  def answer_visual_questions(self, requests: Sequence[VisualQuestionRequest]) -> list[MultipleChoiceReply]:
    """QA curation: the VLM answers with the image attached (with_image) or from the question alone."""
    items = [
      (
        r,
        dict(question=r.question, options=list(r.options), with_image=r.with_image),
        functools.partial(parsing.parse_letter, options=r.options),
      )
      for r in requests
    ]
    outcomes = self._ask(
      "answer_visual_questions",
      "curation_answer",
      items,
      image_ids=[r.image_id if r.with_image else None for r in requests],
    )
    return self._results(outcomes, lambda v: MultipleChoiceReply(reply=v), MultipleChoiceReply)

  # -- RubiCap --------------------------------------------------------------------------------------------

  def check_criteria(self, requests: Sequence[CriterionRequest]) -> list[CriterionVerdict]:
    parse = _json_parser("rubicap_check_criterion")
    outcomes = self._ask(
      "check_criteria",
      "rubicap_check_criterion",
      [(r, dict(caption=r.caption, criterion=r.criterion), parse) for r in requests],
    )
    return self._results(outcomes, lambda v: CriterionVerdict(passed=bool(v["passed"])), CriterionVerdict)

  def write_criteria(self, requests: Sequence[CriteriaWritingRequest]) -> list[WrittenCriteria]:
    parse = _json_parser("rubicap_write_criteria", _criteria)
    outcomes = self._ask(
      "write_criteria",
      "rubicap_write_criteria",
      [
        (
          r,
          dict(
            student_caption=r.student_caption,
            missing=list(r.missing),
            incorrect=list(r.incorrect),
            unpointable=list(r.unpointable),
          ),
          parse,
        )
        for r in requests
      ],
    )
    return self._results(outcomes, lambda v: WrittenCriteria(criteria=v), WrittenCriteria)

  # -- BalCapRL -------------------------------------------------------------------------------------------

  def split_claims(self, requests: Sequence[CaptionRequest]) -> list[ClaimSplit]:
    parse = _json_parser("balcaprl_split_claims", lambda v: tuple(c.strip() for c in v["claims"] if c.strip()))
    outcomes = self._ask(
      "split_claims", "balcaprl_split_claims", [(r, dict(caption=r.caption), parse) for r in requests]
    )
    return self._results(outcomes, lambda v: ClaimSplit(claims=v), ClaimSplit)

  def verify_claims(self, requests: Sequence[ClaimVerificationRequest]) -> list[ClaimVerdicts]:
    def parse(count: int, text: str):
      verdicts = parsing.parse_flags(text, parsing.SCHEMAS["balcaprl_verify_claims"], "verdicts", count)
      return tuple(v["correct"] for v in verdicts), tuple(v["pointable"] for v in verdicts)

    asked = [i for i, r in enumerate(requests) if r.claims]
    outcomes = self._ask(
      "verify_claims",
      "balcaprl_verify_claims",
      [
        (requests[i], dict(claims=list(requests[i].claims)), functools.partial(parse, len(requests[i].claims)))
        for i in asked
      ],
      image_ids=[requests[i].image_id for i in asked],
    )
    results = [ClaimVerdicts() for _ in requests]  # no claims: nothing to verify
    for i, r in zip(
      asked, self._results(outcomes, lambda v: ClaimVerdicts(correct=v[0], pointable=v[1]), ClaimVerdicts)
    ):
      results[i] = r
    return results

  def match_reference_units(self, requests: Sequence[CoverageRequest]) -> list[Coverage]:
    asked = [i for i, r in enumerate(requests) if r.units]
    outcomes = self._ask(
      "match_reference_units",
      "balcaprl_coverage",
      [
        (
          requests[i],
          dict(caption=requests[i].caption, units=list(requests[i].units)),
          functools.partial(
            lambda n, text: tuple(parsing.parse_flags(text, parsing.SCHEMAS["balcaprl_coverage"], "covered", n)),
            len(requests[i].units),
          ),
        )
        for i in asked
      ],
    )
    results = [Coverage() for _ in requests]
    for i, r in zip(asked, self._results(outcomes, lambda v: Coverage(covered=v), Coverage)):
      results[i] = r
    return results

  def rate_language(self, requests: Sequence[CaptionRequest]) -> list[LanguageRatings]:
    parse = _json_parser("balcaprl_rate_language")
    outcomes = self._ask(
      "rate_language", "balcaprl_rate_language", [(r, dict(caption=r.caption), parse) for r in requests]
    )
    return self._results(outcomes, lambda v: LanguageRatings(**v), LanguageRatings)

  # -- pairwise and Likert --------------------------------------------------------------------------------

  def compare_captions(self, requests: Sequence[PairwiseRequest]) -> list[PairwiseVerdict]:
    parse = _json_parser("pairwise")
    outcomes = self._ask(
      "compare_captions",
      "pairwise",
      [(r, dict(caption_a=r.caption_a, caption_b=r.caption_b, reference=r.reference), parse) for r in requests],
      image_ids=[r.image_id for r in requests],
    )
    return self._results(outcomes, lambda v: PairwiseVerdict(winner=v["winner"]), PairwiseVerdict)

  def score_likert(self, requests: Sequence[LikertRequest]) -> list[LikertScore]:
    outcomes = []
    for reference in (False, True):  # two templates; keep request order
      idx = [i for i, r in enumerate(requests) if (r.reference is not None) == reference]
      template = "likert_reference" if reference else "likert_direct"
      got = self._ask(
        "score_likert",
        template,
        [
          (
            requests[i],
            dict(caption=requests[i].caption, reference=requests[i].reference or ""),
            _json_parser(template),
          )
          for i in idx
        ],
        image_ids=None if reference else [requests[i].image_id for i in idx],
      )
      outcomes.extend(zip(idx, got))
    ordered = [o for _, o in sorted(outcomes, key=lambda t: t[0])]
    return self._results(ordered, lambda v: LikertScore(score=v["score"]), LikertScore)


def _json_parser(template: str, convert: Callable[[dict], Any] | None = None) -> Callable[[str], Any]:
  schema = parsing.SCHEMAS[template]

  def parse(text: str) -> Any:
    value = parsing.parse_json_reply(text, schema)
    return convert(value) if convert else value

  return parse


def _criteria(value: Mapping[str, Any]) -> tuple[Criterion, ...]:
  out = []
  for c in value["criteria"]:
    if not c["text"].strip():
      raise parsing.ReplyParseError("reply.criteria has an empty criterion text.")
    out.append(Criterion(c["text"].strip(), c["severity"]))
  return tuple(out)


def _too_many_options(r: MultipleChoiceRequest) -> Outcome | None:
  if 2 <= len(r.options) <= len(parsing.LETTERS):
    return None
  return Outcome(failed=True, error=f"{len(r.options)} options; need 2..{len(parsing.LETTERS)}")
