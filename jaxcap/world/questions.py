"""Multiple-choice questions about a scene: templates, generation with plausible distractors, and parsing.

Question kinds: counting (total, by colour, by shape), colour, shape, size, position, relation, text,
existence, and for clips temporal order and motion. Distractors come from the same category, preferring
values that occur elsewhere in the scene (plausible), and never equal the answer.
`parse_question` inverts the templates so the rule-based judge can read a question as text.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from jaxcap.world import vocabulary as V
from jaxcap.world.scene import Scene
from jaxcap.data.records import MultipleChoiceQuestion

NUM_OPTIONS = 4
STILL_OPTION = "it stays still"

_TEMPLATES: dict[str, str] = {
  "count_total": "How many objects are in the {media}?",
  "count_colour": "How many {colour} objects are there?",
  "count_shape": "How many {shapes} are there?",
  "colour": "What colour is the {shape} {where}?",
  "shape": "What shape is the {colour} object?",
  "size": "What size is the {name}?",
  "position": "Where is the {name}?",
  "relation": "Where is the {name} relative to the {other}?",
  "text": "What text is written on the {name}?",
  "existence": "Is there a {name} in the {media}?",
  "temporal_order": "Which of these objects appears first?",
  "motion": "In which direction does the {name} move?",
}

_NAME = rf"(?P<name>(?:{'|'.join(V.COLOURS)}) (?:{'|'.join(V.SHAPES)}))"
_PARSERS: list[tuple[str, re.Pattern]] = [
  ("count_total", re.compile(r"^how many objects are in the (?:image|clip)\?$")),
  ("count_colour", re.compile(rf"^how many (?P<colour>{'|'.join(V.COLOURS)}) objects are there\?$")),
  ("count_shape", re.compile(rf"^how many (?P<shape>{'|'.join(V.SHAPES)})s are there\?$")),
  (
    "colour",
    re.compile(
      rf"^what colou?r is the (?P<shape>{'|'.join(V.SHAPES)}) (?:in|on|at) the "
      rf"(?P<position>{'|'.join(V.POSITIONS)})\?$"
    ),
  ),
  ("shape", re.compile(rf"^what shape is the (?P<colour>{'|'.join(V.COLOURS)}) object\?$")),
  ("size", re.compile(rf"^what size is the {_NAME}\?$")),
  ("position", re.compile(rf"^where is the {_NAME}\?$")),
  (
    "relation",
    re.compile(
      rf"^where is the {_NAME} relative to the (?P<other>(?:{'|'.join(V.COLOURS)}) "
      rf"(?:{'|'.join(V.SHAPES)}))\?$"
    ),
  ),
  ("text", re.compile(rf"^what text is written on the {_NAME}\?$")),
  ("existence", re.compile(rf"^is there a {_NAME} in the (?:image|clip)\?$")),
  ("temporal_order", re.compile(r"^which of these objects appears first\?$")),
  ("motion", re.compile(rf"^in which direction does the {_NAME} move\?$")),
]


@dataclasses.dataclass(frozen=True)
class QuestionQuery:
  """A parsed question: its kind and the template slots (colour, shape, name, position, other)."""

  kind: str
  slots: dict[str, str]


def parse_question(text: str) -> QuestionQuery | None:
  """Template match of a question's text; None for questions outside the world's templates."""
  low = " ".join(text.lower().split())
  for kind, pattern in _PARSERS:
    if m := pattern.match(low):
      return QuestionQuery(kind, {k: v for k, v in m.groupdict().items() if v})
  return None


def generate_questions(scene: Scene, rng: np.random.Generator) -> list[MultipleChoiceQuestion]:
  """All candidate questions for a scene (before curation), with shuffled distractor choice."""
  media = "clip" if scene.is_clip else "image"
  objs = list(scene.objects)
  out: list[tuple[str, str, str, list[str]]] = []  # (kind, question, answer, candidate distractors)

  n = len(objs)
  out.append(("count_total", _TEMPLATES["count_total"].format(media=media), str(n), _count_distractors(n)))
  colours = sorted({o.colour for o in objs})
  colour = colours[int(rng.integers(len(colours)))]
  k = sum(o.colour == colour for o in objs)
  out.append(("count_colour", _TEMPLATES["count_colour"].format(colour=colour), str(k), _count_distractors(k)))
  shapes = sorted({o.shape for o in objs})
  shape = shapes[int(rng.integers(len(shapes)))]
  k = sum(o.shape == shape for o in objs)
  out.append(("count_shape", _TEMPLATES["count_shape"].format(shapes=V.plural(shape)), str(k), _count_distractors(k)))

  for obj in objs:
    others_colours = [o.colour for o in objs if o is not obj]
    out.append(
      (
        "colour",
        _TEMPLATES["colour"].format(shape=obj.shape, where=V.position_phrase(obj.position)),
        obj.colour,
        _plausible(others_colours, V.COLOURS, obj.colour),
      )
    )
    out.append(("size", _TEMPLATES["size"].format(name=obj.name), obj.size, [s for s in V.SIZES if s != obj.size]))
    out.append(
      (
        "position",
        _TEMPLATES["position"].format(name=obj.name),
        obj.position,
        _plausible([o.position for o in objs if o is not obj], V.POSITIONS, obj.position),
      )
    )
    if sum(o.colour == obj.colour for o in objs) == 1:
      out.append(
        (
          "shape",
          _TEMPLATES["shape"].format(colour=obj.colour),
          obj.shape,
          _plausible([o.shape for o in objs if o is not obj], V.SHAPES, obj.shape),
        )
      )
    if obj.label:
      out.append(
        (
          "text",
          _TEMPLATES["text"].format(name=obj.name),
          obj.label,
          _plausible([o.label for o in objs if o.label and o is not obj], V.LABELS, obj.label),
        )
      )
    if scene.is_clip:
      answer = STILL_OPTION if obj.motion == "still" else obj.motion
      choices = ["left", "right", "up", "down", STILL_OPTION]
      out.append(("motion", _TEMPLATES["motion"].format(name=obj.name), answer, [c for c in choices if c != answer]))

  for a in objs:
    for b in objs:
      if a is not b and (rel := scene.decisive_relation(a.name, b.name)):
        out.append(
          (
            "relation",
            _TEMPLATES["relation"].format(name=a.name, other=b.name),
            rel,
            [r for r in V.RELATIONS if r != rel],
          )
        )

  present = objs[int(rng.integers(n))]
  out.append(("existence", _TEMPLATES["existence"].format(name=present.name, media=media), "yes", ["no"]))
  names = {o.name for o in objs}
  absent = [f"{c} {present.shape}" for c in V.COLOURS if f"{c} {present.shape}" not in names]
  absent += [f"{present.colour} {s}" for s in V.SHAPES if f"{present.colour} {s}" not in names]
  ghost = absent[int(rng.integers(len(absent)))]
  out.append(("existence", _TEMPLATES["existence"].format(name=ghost, media=media), "no", ["yes"]))

  if scene.is_clip and n >= 2:
    first = min(o.appear_frame for o in objs)
    firsts = [o for o in objs if o.appear_frame == first]
    later = [o for o in objs if o.appear_frame > first]
    if len(firsts) == 1 and later:
      picks = [later[i] for i in rng.permutation(len(later))[: NUM_OPTIONS - 1]]
      out.append(("temporal_order", _TEMPLATES["temporal_order"], firsts[0].name, [o.name for o in picks]))

  questions = []
  for i, (kind, text, answer, distractors) in enumerate(out):
    distractors = list(dict.fromkeys(d for d in distractors if d != answer))
    # Keep the plausible (scene-derived) distractors first, then fill from the rest.
    chosen = distractors[: NUM_OPTIONS - 1]
    options = [answer] + chosen
    options = [options[j] for j in rng.permutation(len(options))]
    questions.append(
      MultipleChoiceQuestion(id=f"{scene.id}/q{i:02d}", question=text, options=tuple(options), answer=answer, kind=kind)
    )
  return questions


def _count_distractors(n: int) -> list[str]:
  return [str(c) for c in (n + 1, n - 1, n + 2, n - 2, n + 3) if c >= 0 and c != n]


def _plausible(in_scene, vocabulary, answer) -> list[str]:
  """Distractors: values seen elsewhere in the scene first, then the rest of the vocabulary (stable order)."""
  seen = [v for v in dict.fromkeys(in_scene) if v != answer]
  rest = [v for v in vocabulary if v != answer and v not in seen]
  return seen + rest
