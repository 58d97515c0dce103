"""The rule-based judge's rubrics (RubiCap): the criteria its rubric writer writes, in a fixed wording that it parses
back when it checks a caption against them (`jaxcap.world.judge.RuleBasedJudge.write_criteria` / `check_criteria`).

A criterion is one of: STATES_PREFIX + a fact the caption must state, DENIES_PREFIX + a fact it must not claim,
or NO_META_CRITERION (no sentence without visual content); a text of neither form is read as facts to state.
"""

from __future__ import annotations

from typing import Sequence

from jaxcap.data.records import Criterion
from jaxcap.judges.protocol import CriterionVerdict
from jaxcap.world.grounding import specific_claims
from jaxcap.world.language import parse_caption

STATES_PREFIX = "The caption states: "
DENIES_PREFIX = "The caption does not claim: "
NO_META_CRITERION = "The caption contains no meta-commentary or other statements without visual content."


def written_criteria(missing: Sequence[str], incorrect: Sequence[str], unpointable: bool) -> tuple[Criterion, ...]:
  """The criteria for a rubric from the consensus units the caption misses, the claims it gets wrong and whether
  it holds unpointable sentences."""
  criteria = []
  for unit in missing:
    # Missing objects and imprecise attributes are "important"; a missing backdrop is "minor".
    kinds = {c.kind for c in specific_claims(unit)}
    criteria.append(Criterion(STATES_PREFIX + unit, "minor" if kinds == {"background"} else "important"))
  for claim in incorrect:
    criteria.append(Criterion(DENIES_PREFIX + claim, "critical"))  # hallucination / misidentification
  if unpointable:
    criteria.append(Criterion(NO_META_CRITERION, "minor"))
  return tuple(criteria)


def check_criterion(caption: str, criterion: str) -> CriterionVerdict:
  """Whether `caption` meets `criterion` (failed when the criterion states no fact this parser can check)."""
  claims = parse_caption(caption)
  keys = {c.key for c in claims}
  text = criterion.strip()
  if text == NO_META_CRITERION:
    return CriterionVerdict(passed=bool(claims) and not any(c.kind == "meta" for c in claims))
  negated = text.startswith(DENIES_PREFIX)
  body = (
    text[len(DENIES_PREFIX if negated else STATES_PREFIX) :] if (negated or text.startswith(STATES_PREFIX)) else text
  )
  wanted = specific_claims(body)
  if not wanted:
    return CriterionVerdict(failed=True, error=f"criterion states no checkable fact: {text!r}")
  stated = all(w.key in keys for w in wanted)
  return CriterionVerdict(passed=not stated if negated else stated)
