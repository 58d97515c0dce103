"""The world's caption language: atomic claims and their canonical sentences (read back by
`jaxcap.world.language`)."""

from __future__ import annotations

import dataclasses

from jaxcap.world import vocabulary as V

CLAIM_KINDS = (
  "exists",
  "size",
  "position",
  "label",
  "relation",
  "overlap",
  "count",
  "background",
  "motion",
  "appear",
  "meta",
)


@dataclasses.dataclass(frozen=True)
class Claim:
  """One atomic statement. `subject`/`other` are canonical object names ("red circle")."""

  kind: str
  subject: str | None = None
  value: str | None = None
  other: str | None = None
  text: str = dataclasses.field(default="", compare=False)

  @property
  def key(self) -> tuple:
    """Identity up to paraphrase: "A right of B" == "B left of A"; overlaps are unordered."""
    if self.kind == "relation" and self.value in ("right of", "below"):
      flipped = {"right of": "left of", "below": "above"}[self.value]
      return ("relation", self.other, flipped, self.subject)
    if self.kind == "overlap":
      a, b = sorted((self.subject, self.other))
      return ("overlap", a, None, b)
    if self.kind == "meta":
      return ("meta", None, _squash(self.text), None)
    return (self.kind, self.subject, self.value, self.other)


def claim_text(claim: Claim) -> str:
  """The canonical sentence for a claim; parse_caption(claim_text(c)) recovers c (plus its `exists`)."""
  s, v, o = claim.subject, claim.value, claim.other
  if claim.kind == "exists":
    return f"There is a {s}."
  if claim.kind == "size":
    return f"The {s} is {v}."
  if claim.kind == "position":
    return f"The {s} is {V.position_phrase(v)}."
  if claim.kind == "label":
    return f'The {s} is labelled "{v}".'
  if claim.kind == "relation":
    return f"The {s} is {v} the {o}."
  if claim.kind == "overlap":
    return f"The {s} overlaps the {o}."
  if claim.kind == "count":
    return f"There {'is' if v == '1' else 'are'} {v} object{'' if v == '1' else 's'}."
  if claim.kind == "background":
    return f"The background is {v}."
  if claim.kind == "motion":
    return f"The {s} stays still." if v == "still" else f"The {s} moves {v}."
  if claim.kind == "appear":
    return f"The {s} appears in frame {int(v) + 1}."
  if claim.kind == "meta":
    return claim.text
  raise ValueError(f"Unknown claim kind {claim.kind!r}; expected one of {CLAIM_KINDS}.")


def unique_claims(claims: list[Claim]) -> list[Claim]:
  """First occurrence of each claim key, order kept."""
  seen, out = set(), []
  for c in claims:
    if c.key not in seen:
      seen.add(c.key)
      out.append(c)
  return out


def _squash(text: str) -> str:
  return " ".join(text.lower().split())
