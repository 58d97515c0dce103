"""Reading a caption against a scene's ground truth: whether a claim holds, the answer a careful reader derives
from what a caption states, a guess from the question alone, and overall caption quality. The rule-based judge
(`jaxcap.world.judge`) answers every protocol request with these."""

from __future__ import annotations

import hashlib
import re
from typing import Sequence

from jaxcap.world import vocabulary as V
from jaxcap.world.captions import reference_units
from jaxcap.world.claims import Claim, unique_claims
from jaxcap.world.language import CaptionFacts, parse_caption
from jaxcap.world.language_rating import linguistic_score
from jaxcap.world.questions import STILL_OPTION, QuestionQuery, parse_question
from jaxcap.world.scene import Scene

_CANNOT_ANSWER_RE = re.compile(r"\bcan\s*not answer\b|\bcannot answer\b|\bnot answerable\b", re.I)


def unit_hash(*parts: object) -> float:
  """A uniform number in [0, 1) from the parts' text; stable across processes (unlike hash())."""
  digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
  return int.from_bytes(digest, "little") / 2**64


def specific_claims(text: str) -> list[Claim]:
  """The facts a unit/criterion sentence asks for: its non-`exists` claims, or its `exists` claims."""
  claims = [c for c in parse_caption(text) if c.kind != "meta"]
  specific = [c for c in claims if c.kind != "exists"]
  return specific or claims


def claim_holds(claim: Claim, scene: Scene) -> bool:
  """Whether a parsed claim is true of the scene's ground truth."""
  if claim.kind == "meta":
    return False
  if claim.kind == "count":
    return int(claim.value) == len(scene.objects)
  if claim.kind == "background":
    return claim.value == scene.background
  obj = scene.find(claim.subject)
  if obj is None:
    return False
  if claim.kind == "exists":
    return True
  if claim.kind == "size":
    return obj.size == claim.value
  if claim.kind == "position":
    return obj.position == claim.value
  if claim.kind == "label":
    return obj.label is not None and obj.label.upper() == claim.value
  if claim.kind == "relation":
    return scene.relation_holds(claim.subject, claim.value, claim.other)
  if claim.kind == "overlap":
    return scene.overlaps(claim.subject, claim.other)
  if claim.kind == "motion":
    return scene.is_clip and obj.motion == claim.value
  if claim.kind == "appear":
    return scene.is_clip and obj.appear_frame == int(claim.value)
  raise ValueError(f"Unknown claim kind {claim.kind!r}.")


def answer_from_facts(query: QuestionQuery, facts: CaptionFacts) -> str | None:
  """The answer (option text) a careful reader derives from the caption's facts, or None if unsettled."""
  objs, s = facts.objects, query.slots
  k = query.kind
  if k == "count_total":
    return str(facts.count) if facts.count is not None else (str(len(objs)) if objs else None)
  if k in ("count_colour", "count_shape"):
    if not objs:
      return None
    idx, value = (0, s["colour"]) if k == "count_colour" else (1, s["shape"])
    return str(sum(name.split()[idx] == value for name in objs))
  if k == "colour":
    hits = [n for n, a in objs.items() if n.split()[1] == s["shape"] and a.get("position") == s["position"]]
    return hits[0].split()[0] if len(hits) == 1 else None
  if k == "shape":
    hits = [n for n in objs if n.split()[0] == s["colour"]]
    return hits[0].split()[1] if len(hits) == 1 else None
  if k in ("size", "position", "text"):
    attribute = {"size": "size", "position": "position", "text": "label"}[k]
    return objs.get(s["name"], {}).get(attribute)
  if k == "motion":
    motion = objs.get(s["name"], {}).get("motion")
    return STILL_OPTION if motion == "still" else motion
  if k == "existence":
    if s["name"] in objs:
      return "yes"
    return "no" if facts.is_exhaustive else None
  if k == "relation":
    return relation_from_facts(s["name"], s["other"], facts)
  return None


def first_to_appear(options: Sequence[str], facts: CaptionFacts) -> str | None:
  """The option (an object name) the caption says appears earliest; None unless every option's frame is stated."""
  frames = []
  for option in options:
    frame = facts.objects.get(option.strip().lower(), {}).get("appear")
    if frame is None:
      return None
    frames.append(int(frame))
  first = min(frames)
  return options[frames.index(first)] if frames.count(first) == 1 else None


def relation_from_facts(a: str, b: str, facts: CaptionFacts) -> str | None:
  for rel, flipped in (("left of", "right of"), ("above", "below")):
    if ("relation", a, rel, b) in facts.relations:
      return rel
    if ("relation", b, rel, a) in facts.relations:
      return flipped
  pa, pb = facts.objects.get(a, {}).get("position"), facts.objects.get(b, {}).get("position")
  if pa is None or pb is None:
    return None
  (ra, ca), (rb, cb) = divmod(V.POSITIONS.index(pa), 3), divmod(V.POSITIONS.index(pb), 3)
  if ra == rb and ca != cb:
    return "left of" if ca < cb else "right of"
  if ca == cb and ra != rb:
    return "above" if ra < rb else "below"
  return None


def uninformed_choice(question: str, options: Sequence[str]) -> int:
  """A guess that uses only the question text: echo an option the question contains, else a content hash.

  Independent of option order, so rotating the options never turns a guess into a correct answer by luck.
  """
  low = " " + " ".join(question.lower().split()) + " "
  echoed = [i for i, o in enumerate(options) if f" {o.strip().lower()} " in low]
  if echoed:
    return echoed[0]
  return min(range(len(options)), key=lambda i: unit_hash("guess", question, options[i].strip().lower()))


def chosen_option(caption: str, question: str, options: Sequence[str]) -> int:
  """The option (index) a reader picks from what `caption` states: the answer it settles, else a "cannot answer"
  option if offered, else `uninformed_choice`."""
  facts = CaptionFacts.from_caption(caption)
  query = parse_question(question)
  answer = None
  if query is not None and query.kind == "temporal_order":
    answer = first_to_appear(options, facts)
  elif query is not None:
    answer = answer_from_facts(query, facts)
  lowered = [o.strip().lower() for o in options]
  if answer is not None and answer.lower() in lowered:
    return lowered.index(answer.lower())
  abstain = [i for i, o in enumerate(options) if _CANNOT_ANSWER_RE.search(o)]
  if abstain:
    return abstain[0]
  return uninformed_choice(question, options)


# ---- overall quality -------------------------------------------------------------------------------------


def caption_quality(caption: str, scene: Scene) -> float:
  """Overall quality in [0, 1]: precision and recall against ground truth, plus language."""
  claims = unique_claims(parse_caption(caption))
  if not claims:
    return 0.0
  precision = sum(claim_holds(c, scene) for c in claims) / len(claims)
  keys = {c.key for c in claims}
  units = reference_units(scene)
  recall = sum(all(w.key in keys for w in specific_claims(u)) for u in units) / max(1, len(units))
  return 0.4 * precision + 0.4 * recall + 0.2 * linguistic_score(caption)
