"""The world's caption language read back: a deterministic parser from captions to claims (`jaxcap.world.claims`).

A caption is split into sentences; each sentence into entity mentions ("large red circle"); the text
between one mention and the next carries that entity's attributes (position, label, motion, ...) or, when
it ends in a relation phrase ("is left of the"), a relation to the next mention. A sentence that states no
fact of the world (meta-commentary, instructions, negations) becomes one `meta` claim, which can never be
verified or pointed at.
"""

from __future__ import annotations

import dataclasses
import functools
import re

from jaxcap.world import vocabulary as V
from jaxcap.world.claims import Claim


def _alternatives(words) -> str:
  return "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))


_SIZE = _alternatives(V.SIZE_SYNONYMS)
_COLOUR = _alternatives(V.COLOUR_SYNONYMS)
_SHAPE = _alternatives(V.SHAPE_SYNONYMS)
_POSITION = _alternatives(V.POSITION_SYNONYMS)
_NUMBER = _alternatives(V.NUMBER_WORDS) + r"|\d+"
_BACKGROUND = _alternatives(V.BACKGROUNDS)

ENTITY_RE = re.compile(rf"\b(?:(?P<size>{_SIZE})\s+)?(?P<colour>{_COLOUR})\s+(?P<shape>{_SHAPE})(?:e?s)?\b")
_POSITION_RE = re.compile(
  rf"\b(?:in|at|on|near|towards?|into|occupies|occupying)\s+(?:the\s+)?(?P<pos>{_POSITION})"
  r"(?:\s+(?:corner|side|edge|area|part|region))?\b(?!\s+of\b)"
)
_RELATION_AT_END_RE = re.compile(
  r"(?P<rel>(?:to\s+the\s+)?left\s+of|(?:to\s+the\s+)?right\s+of|above|below|under(?:neath)?|beneath"
  r"|overlap(?:s|ping)?(?:\s+with)?)\s*(?:the\s+|a\s+|an\s+)?$"
)
_SIZE_PREDICATE_RE = re.compile(rf"\b(?:is|looks|appears)\s+(?:quite\s+|very\s+|rather\s+)?(?P<size>{_SIZE})\b")
_LABEL_RE = re.compile(r'"(?P<label>[^"]+)"')
_MOVES_RE = re.compile(
  r"\bmov(?:es|ing|e)\s+(?P<dir>to\s+the\s+left|to\s+the\s+right|leftwards?|rightwards?|upwards?|downwards?"
  r"|left|right|up|down)\b"
)
_STILL_RE = re.compile(
  r"\b(?:stays|remains|is|sits|stands)\s+(?:completely\s+)?(?:still|stationary|motionless|in\s+place)\b"
  r"|\bdoes\s+not\s+move\b|\bnever\s+moves\b"
)
_APPEAR_RE = re.compile(r"\b(?:appears?|enters?|shows\s+up)\s+(?:in|at)\s+frame\s+(?P<frame>\d+)\b")
_COUNT_RE = re.compile(
  rf"\b(?P<n>{_NUMBER})\s+(?:(?:different|distinct|colou?red|visible|simple|geometric)\s+)*"
  r"(?:objects?|shapes|items|things)\b"
)
_BACKGROUND_RE = re.compile(rf"\b(?P<bg>{_BACKGROUND})\s+background\b|\bbackground\s+is\s+(?P<bg2>{_BACKGROUND})\b")
# Negated sentences are not parsed into facts: "there is no red circle" must not count as mentioning one.
_NEGATION_RE = re.compile(r"\b(?:no|not|never|without|nor|neither)\b|n't\b")
_PRONOUN_RE = re.compile(r"^\s*it\b", re.I)
_SENTENCE_SPLIT_RE = re.compile(r"(?<=[.!?;])\s+|\n+")


def split_sentences(caption: str) -> list[str]:
  """Non-empty sentences of a caption, trailing punctuation kept."""
  caption = caption.replace("\u201c", '"').replace("\u201d", '"')
  return [s.strip() for s in _SENTENCE_SPLIT_RE.split(caption) if s.strip(" .!?;\t")]


def parse_caption(caption: str) -> list[Claim]:
  """All claims of a caption in order of appearance (duplicates kept)."""
  return list(_parse_cached(caption))


@functools.lru_cache(maxsize=65536)
def _parse_cached(caption: str) -> tuple[Claim, ...]:
  # Judges re-read the same caption for every question and criterion; parsing is pure, so memoise it.
  claims: list[Claim] = []
  last_subject = None
  for sentence in split_sentences(caption):
    # Minimal coreference: a sentence opening with "It" that names no object is about the last one named.
    if last_subject and _PRONOUN_RE.match(sentence) and not ENTITY_RE.search(sentence.lower()):
      sentence = _PRONOUN_RE.sub(f"The {last_subject}", sentence, count=1)
    parsed = parse_sentence(sentence)
    claims.extend(parsed)
    named = [c.subject for c in parsed if c.kind == "exists"]
    last_subject = named[-1] if named else last_subject
  return tuple(claims)


def parse_sentence(sentence: str) -> list[Claim]:
  """Claims stated by one sentence; a sentence stating nothing of the world is one `meta` claim."""
  low = sentence.lower().replace("\u201c", '"').replace("\u201d", '"')
  meta = [Claim("meta", text=sentence.strip())]
  without_still = _STILL_RE.sub(" ", low)
  if _NEGATION_RE.search(_LABEL_RE.sub(" ", without_still)):
    return meta
  claims: list[Claim] = []
  for m in _COUNT_RE.finditer(low):
    n = m.group("n")
    claims.append(Claim("count", value=str(V.NUMBER_WORDS.get(n, n) if not n.isdigit() else int(n)), text=sentence))
  for m in _BACKGROUND_RE.finditer(low):
    claims.append(Claim("background", value=m.group("bg") or m.group("bg2"), text=sentence))
  mentions = list(ENTITY_RE.finditer(low))
  for i, m in enumerate(mentions):
    name = f"{V.COLOUR_SYNONYMS[m.group('colour')]} {V.SHAPE_SYNONYMS[m.group('shape')]}"
    claims.append(Claim("exists", subject=name, text=sentence))
    if m.group("size"):
      claims.append(Claim("size", subject=name, value=V.SIZE_SYNONYMS[m.group("size")], text=sentence))
    end = mentions[i + 1].start() if i + 1 < len(mentions) else len(low)
    segment = low[m.end() : end]
    if i == 0:  # "In the top left sits a red circle": leading attributes belong to the first mention
      segment = low[: m.start()] + " , " + segment
    if i + 1 < len(mentions):
      rel = _RELATION_AT_END_RE.search(segment)
      if rel:
        nxt = mentions[i + 1]
        other = f"{V.COLOUR_SYNONYMS[nxt.group('colour')]} {V.SHAPE_SYNONYMS[nxt.group('shape')]}"
        claims.append(_relation_claim(name, rel.group("rel"), other, sentence))
        segment = segment[: rel.start()]
    claims.extend(_attribute_claims(name, segment, sentence))
  return claims or meta


def _relation_claim(subject: str, phrase: str, other: str, sentence: str) -> Claim:
  phrase = " ".join(phrase.split())
  if phrase.startswith("overlap"):
    return Claim("overlap", subject=subject, other=other, text=sentence)
  if "left of" in phrase:
    value = "left of"
  elif "right of" in phrase:
    value = "right of"
  elif phrase == "above":
    value = "above"
  else:
    value = "below"
  return Claim("relation", subject=subject, value=value, other=other, text=sentence)


def _attribute_claims(name: str, segment: str, sentence: str) -> list[Claim]:
  out = []
  if m := _SIZE_PREDICATE_RE.search(segment):
    out.append(Claim("size", subject=name, value=V.SIZE_SYNONYMS[m.group("size")], text=sentence))
  if m := _POSITION_RE.search(segment):
    out.append(Claim("position", subject=name, value=V.POSITION_SYNONYMS[m.group("pos")], text=sentence))
  if m := _LABEL_RE.search(segment):
    out.append(Claim("label", subject=name, value=m.group("label").strip().upper(), text=sentence))
  if m := _MOVES_RE.search(segment):
    direction = " ".join(m.group("dir").split())
    out.append(
      Claim(
        "motion",
        subject=name,
        value=V.MOTION_SYNONYMS[direction.rstrip("s") if direction.endswith("wards") else direction],
        text=sentence,
      )
    )
  elif _STILL_RE.search(segment):
    out.append(Claim("motion", subject=name, value="still", text=sentence))
  if m := _APPEAR_RE.search(segment):
    out.append(Claim("appear", subject=name, value=str(max(0, int(m.group("frame")) - 1)), text=sentence))
  return out


@dataclasses.dataclass
class CaptionFacts:
  """What a reader can take from a caption: the objects it names and what it says about them."""

  objects: dict[str, dict[str, str]]  # name -> {attribute kind -> first stated value}
  relations: set[tuple]  # Claim.key of relation/overlap claims
  count: int | None  # stated total object count, if any

  @classmethod
  def from_caption(cls, caption: str) -> "CaptionFacts":
    objects: dict[str, dict[str, str]] = {}
    relations: set[tuple] = set()
    count = None
    for c in parse_caption(caption):
      if c.kind == "exists":
        objects.setdefault(c.subject, {})
      elif c.kind in ("size", "position", "label", "motion", "appear"):
        objects.setdefault(c.subject, {}).setdefault(c.kind, c.value)
      elif c.kind in ("relation", "overlap"):
        relations.add(c.key)
      elif c.kind == "count" and count is None:
        count = int(c.value)
    return cls(objects=objects, relations=relations, count=count)

  @property
  def is_exhaustive(self) -> bool:
    """True when the caption says how many objects there are and names exactly that many."""
    return self.count is not None and self.count == len(self.objects) > 0
