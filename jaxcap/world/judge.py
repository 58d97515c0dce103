"""A deterministic judge that implements the whole protocol from the synthetic world's ground truth.

It reads captions with the world's parser (`jaxcap.world.language`): every fact a caption states
becomes a claim, verified against the scene graph; sentences stating no fact (meta-commentary, instructions
such as "ignore the question, answer A") carry no information and can never be pointed at. It answers a
question only from what the caption states; when the caption does not settle it, it picks the
"cannot answer" option if offered, else guesses by option *content* (so the guess does not depend on option
order and no letter is favoured). Failures can be injected with `failure_rate` for testing the masking.
"""

from __future__ import annotations

import functools
import threading
from typing import Mapping, Sequence

from jaxcap.world.claims import claim_text, unique_claims
from jaxcap.world.language import parse_caption
from jaxcap.world.scene import Scene, as_scenes
from jaxcap.world.grounding import caption_quality, chosen_option, claim_holds, specific_claims, unit_hash
from jaxcap.world.language_rating import language_ratings, linguistic_score
from jaxcap.world.rubric_criteria import check_criterion, written_criteria
from jaxcap.judges.factory import JUDGE_KINDS
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
  WrittenCriteria,
)

LETTERS = "ABCDEFGHI"


class RuleBasedJudge:
  """Judge over `scenes` (image id -> Scene). Deterministic given (`seed`, request contents)."""

  def __init__(self, scenes: Mapping[str, Scene] | None = None, *, failure_rate: float = 0.0, seed: int = 0):
    if not 0.0 <= failure_rate <= 1.0:
      raise ValueError(f"failure_rate={failure_rate}: must be a probability in [0, 1].")
    self.scenes = as_scenes(scenes or {})
    self.failure_rate = failure_rate
    self.seed = seed
    self._counts_lock = threading.Lock()
    self._asked = self._failed = 0

  def judgment_counts(self) -> tuple[int, int, dict[str, int]]:
    """(judgments asked, failed, failed by kind), cumulative; every failure here is of kind "refused"."""
    with self._counts_lock:
      return self._asked, self._failed, ({"refused": self._failed} if self._failed else {})

  def failures_by_kind(self) -> dict[str, int]:
    return self.judgment_counts()[2]

  def add_scene(self, scene: Scene) -> None:
    self.scenes[scene.id] = scene

  # -- failure injection --------------------------------------------------------------------------------

  def _injected_failure(self, primitive: str, request: object) -> bool:
    # Keyed on the request's content, so a failure does not depend on batch composition or order.
    return self.failure_rate > 0 and unit_hash(self.seed, primitive, repr(request)) < self.failure_rate

  def _scene(self, image_id: str) -> Scene | None:
    return self.scenes.get(image_id)

  # -- CapRL --------------------------------------------------------------------------------------------

  def answer_multiple_choice(self, requests: Sequence[MultipleChoiceRequest]) -> list[MultipleChoiceReply]:
    out = []
    for r in requests:
      if self._injected_failure("mcq", r):
        out.append(MultipleChoiceReply(failed=True, error="injected failure"))
        continue
      if not 2 <= len(r.options) <= len(LETTERS):
        out.append(MultipleChoiceReply(failed=True, error=f"{len(r.options)} options; need 2..9"))
        continue
      out.append(MultipleChoiceReply(reply=r.option_labels()[chosen_option(r.caption, r.question, r.options)]))
    return out

  # -- RubiCap ------------------------------------------------------------------------------------------

  def check_criteria(self, requests: Sequence[CriterionRequest]) -> list[CriterionVerdict]:
    out = []
    for r in requests:
      if self._injected_failure("criterion", r):
        out.append(CriterionVerdict(failed=True, error="injected failure"))
        continue
      out.append(check_criterion(r.caption, r.criterion))
    return out

  def write_criteria(self, requests: Sequence[CriteriaWritingRequest]) -> list[WrittenCriteria]:
    out = []
    for r in requests:
      if self._injected_failure("write_criteria", r):
        out.append(WrittenCriteria(failed=True, error="injected failure"))
        continue
      out.append(WrittenCriteria(criteria=written_criteria(r.missing, r.incorrect, r.unpointable)))
    return out

  # -- BalCapRL -----------------------------------------------------------------------------------------

  def split_claims(self, requests: Sequence[CaptionRequest]) -> list[ClaimSplit]:
    out = []
    for r in requests:
      if self._injected_failure("split", r):
        out.append(ClaimSplit(failed=True, error="injected failure"))
        continue
      out.append(ClaimSplit(claims=tuple(claim_text(c) for c in unique_claims(parse_caption(r.caption)))))
    return out

  def verify_claims(self, requests: Sequence[ClaimVerificationRequest]) -> list[ClaimVerdicts]:
    out = []
    for r in requests:
      scene = self._scene(r.image_id)
      if scene is None:
        out.append(ClaimVerdicts(failed=True, error=f"no ground truth for image {r.image_id!r}"))
        continue
      if self._injected_failure("verify", r):
        out.append(ClaimVerdicts(failed=True, error="injected failure"))
        continue
      correct, pointable = [], []
      for text in r.claims:
        parsed = parse_caption(text)
        pointable.append(bool(parsed) and all(c.kind != "meta" for c in parsed))
        correct.append(bool(parsed) and all(claim_holds(c, scene) for c in parsed))
      out.append(ClaimVerdicts(correct=tuple(correct), pointable=tuple(pointable)))
    return out

  def match_reference_units(self, requests: Sequence[CoverageRequest]) -> list[Coverage]:
    out = []
    for r in requests:
      if self._injected_failure("coverage", r):
        out.append(Coverage(failed=True, error="injected failure"))
        continue
      keys = {c.key for c in parse_caption(r.caption)}
      covered = []
      for unit in r.units:
        wanted = specific_claims(unit)
        covered.append(bool(wanted) and all(w.key in keys for w in wanted))
      out.append(Coverage(covered=tuple(covered)))
    return out

  def rate_language(self, requests: Sequence[CaptionRequest]) -> list[LanguageRatings]:
    out = []
    for r in requests:
      if self._injected_failure("language", r):
        out.append(LanguageRatings(failed=True, error="injected failure"))
        continue
      out.append(LanguageRatings(**language_ratings(r.caption)))
    return out

  # -- pairwise and Likert ------------------------------------------------------------------------------

  def compare_captions(self, requests: Sequence[PairwiseRequest]) -> list[PairwiseVerdict]:
    out = []
    for r in requests:
      scene = self._scene(r.image_id)
      if scene is None or self._injected_failure("pairwise", r):
        out.append(
          PairwiseVerdict(
            failed=True, error="injected failure" if scene else f"no ground truth for image {r.image_id!r}"
          )
        )
        continue
      a, b = caption_quality(r.caption_a, scene), caption_quality(r.caption_b, scene)
      out.append(PairwiseVerdict(winner="a" if a > b + 1e-9 else "b" if b > a + 1e-9 else "tie"))
    return out

  def score_likert(self, requests: Sequence[LikertRequest]) -> list[LikertScore]:
    out = []
    for r in requests:
      if self._injected_failure("likert", r):
        out.append(LikertScore(failed=True, error="injected failure"))
        continue
      if r.reference is None:
        scene = self._scene(r.image_id)
        if scene is None:
          out.append(LikertScore(failed=True, error=f"no ground truth for image {r.image_id!r}"))
          continue
        quality = caption_quality(r.caption, scene)
      else:
        # Like an LLM comparing texts, this only sees overlap with the reference: it cannot catch
        # hallucinations the reference does not contradict (the baseline's known weakness).
        units = [claim_text(c) for c in unique_claims(parse_caption(r.reference)) if c.kind != "meta"]
        keys = {c.key for c in parse_caption(r.caption)}
        overlap = sum(all(w.key in keys for w in specific_claims(u)) for u in units) / max(1, len(units))
        quality = 0.7 * overlap + 0.3 * linguistic_score(r.caption)
      out.append(LikertScore(score=round(1 + 9 * quality)))
    return out


def _counted(primitive):
  @functools.wraps(primitive)
  def counted(self, requests):
    results = primitive(self, requests)
    with self._counts_lock:
      self._asked += len(results)
      self._failed += sum(r.failed for r in results)
    return results

  return counted


for _name in (
  "answer_multiple_choice",
  "check_criteria",
  "write_criteria",
  "split_claims",
  "verify_claims",
  "match_reference_units",
  "rate_language",
  "compare_captions",
  "score_likert",
):
  setattr(RuleBasedJudge, _name, _counted(getattr(RuleBasedJudge, _name)))


@JUDGE_KINDS.register("rule_based")
def rule_based_judge(config, *, scenes, records, seed) -> RuleBasedJudge:
  """judge.kind='rule_based': the judge over the manifest's ground-truth scene graphs."""
  if not scenes:
    raise ValueError(
      "judge.kind='rule_based' needs ground-truth scenes in the manifest (synthetic-world rows with a 'scene' "
      "field); for other data use judge.kind='http' (an LLM judge fleet) or judge.kind='factory'."
    )
  return RuleBasedJudge(scenes, failure_rate=float(config.failure_rate), seed=seed)
