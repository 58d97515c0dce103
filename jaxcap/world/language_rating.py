"""How the rule-based judge rates a caption's language: clarity, fluency and coherence on 1-10, as an LLM judge
answers them, from sentence-level evidence (repetition, malformed or rambling sentences, back-to-back repeated
words, meta talk, contradictory claims)."""

from __future__ import annotations

import re

from jaxcap.world.language import parse_caption, split_sentences

_STUTTER_RE = re.compile(r"\b(\w+)(?:\s+\1\b)+", re.I)


def language_ratings(caption: str) -> dict[str, float]:
  """Clarity, fluency, coherence on 1-10 from sentence-level evidence (repetition, meta, contradictions)."""
  sentences = split_sentences(caption)
  if not sentences:
    return {"clarity": 1.0, "fluency": 1.0, "coherence": 1.0}
  squashed = [" ".join(s.lower().split()) for s in sentences]
  duplicate = 1 - len(set(squashed)) / len(squashed)
  malformed = sum(not (s[0].isupper() or s[0] in "\"'") or s[-1] not in ".!?" for s in sentences) / len(sentences)
  rambling = sum(len(s.split()) > 40 for s in sentences) / len(sentences)
  # A word repeated back to back ("is in the the left") is the garbling an LLM judge marks down at once, and
  # the cheapest way for a policy to turn a wrong claim into no claim at all.
  stutter = sum(bool(_STUTTER_RE.search(s)) for s in sentences) / len(sentences)
  claims = parse_caption(caption)
  meta = sum(c.kind == "meta" for c in claims) / max(1, len(claims))
  values: dict[tuple, set] = {}
  for c in claims:
    if c.kind in ("size", "position", "label", "motion", "appear", "count", "background"):
      values.setdefault((c.kind, c.subject), set()).add(c.value)
  contradiction = sum(len(v) > 1 for v in values.values()) / max(1, len(values))
  clamp = lambda x: float(min(10, max(1, round(x))))  # noqa: E731  LLM judges answer in integers
  return {
    "clarity": clamp(10 - 9 * meta - 3 * rambling - 4 * stutter),
    "fluency": clamp(10 - 9 * duplicate - 4 * malformed - 3 * rambling - 8 * stutter),
    "coherence": clamp(10 - 12 * contradiction - 6 * duplicate - 3 * meta),
  }


def linguistic_score(caption: str) -> float:
  """The three ratings mapped to [0, 1] and averaged."""
  r = language_ratings(caption)
  return sum((v - 1) / 9 for v in r.values()) / 3
