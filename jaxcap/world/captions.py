"""Dense reference captions and the five-teacher committee (distinct styles and error profiles)."""

from __future__ import annotations

import numpy as np

from jaxcap.world import vocabulary as V
from jaxcap.world.claims import claim_text, unique_claims
from jaxcap.world.language import parse_caption
from jaxcap.world.scene import Scene, SceneObject

# name -> what goes wrong in that teacher's captions; the RubiCap committee.
TEACHER_STYLES: dict[str, str] = {
  "meticulous": "complete and correct; sometimes omits one relation",
  "terse": "lists colours and shapes only; no sizes, positions, labels or relations",
  "hallucinating": "complete, but invents one object and sometimes misreads a label",
  "spatially_confused": "names objects and sizes, but about half of positions and all relations are wrong",
  "poetic": "synonyms and meta-commentary; skips about a third of the objects and all counts",
}


def _media(scene: Scene) -> str:
  return "clip" if scene.is_clip else "image"


def _temporal(obj: SceneObject) -> str:
  motion = "stays still" if obj.motion == "still" else f"moves {obj.motion}"
  return f" It appears in frame {obj.appear_frame + 1} and {motion}."


def _relation_pairs(scene: Scene) -> list[tuple[str, str, str]]:
  """Every clear-cut relation, once per unordered pair: (subject, relation, other), subject listed later."""
  out = []
  for j, obj in enumerate(scene.objects):
    for prev in scene.objects[:j]:
      if rel := scene.decisive_relation(obj.name, prev.name):
        out.append((obj.name, rel, prev.name))
  return out


def _overlap_pairs(scene: Scene) -> list[tuple[str, str]]:
  names = [o.name for o in scene.objects]
  return [(a, b) for i, a in enumerate(names) for b in names[i + 1 :] if scene.overlaps(a, b)]


def reference_caption(scene: Scene) -> str:
  """The dense, fully correct caption every scene ships with (the recall reference)."""
  n = len(scene.objects)
  parts = [
    f"The {_media(scene)} shows {V.number_word(n)} object{'s' if n != 1 else ''} on a {scene.background} background."
  ]
  for obj in scene.objects:
    label = f', labelled "{obj.label}"' if obj.label else ""
    parts.append(f"A {obj.size} {obj.name} is {V.position_phrase(obj.position)}{label}.")
    if scene.is_clip:
      parts[-1] = (
        f"A {obj.size} {obj.name} is {V.position_phrase(obj.position)}{label}.{_temporal(obj).replace('It', 'The ' + obj.name, 1)}"
      )
  parts += [f"The {a} is {r} the {b}." for a, r, b in _relation_pairs(scene)]
  parts += [f"The {a} overlaps the {b}." for a, b in _overlap_pairs(scene)]
  return " ".join(parts)


def reference_units(scene: Scene) -> list[str]:
  """Atomic facts of the reference caption, one canonical sentence each (BalCapRL's O)."""
  return [claim_text(c) for c in unique_claims(parse_caption(reference_caption(scene))) if c.kind != "meta"]


def teacher_captions(scene: Scene, rng: np.random.Generator) -> dict[str, str]:
  """One caption per TEACHER_STYLES entry, with that teacher's errors drawn from `rng`."""
  return {
    "meticulous": _meticulous(scene, rng),
    "terse": _terse(scene, rng),
    "hallucinating": _hallucinating(scene, rng),
    "spatially_confused": _spatially_confused(scene, rng),
    "poetic": _poetic(scene, rng),
  }


def _order(scene: Scene, rng: np.random.Generator) -> list[SceneObject]:
  return [scene.objects[i] for i in rng.permutation(len(scene.objects))]


def _meticulous(scene: Scene, rng: np.random.Generator) -> str:
  n = len(scene.objects)
  parts = [f"This {_media(scene)} contains {n} distinct objects against a {scene.background} background."]
  for obj in _order(scene, rng):
    label = f' It carries the text "{obj.label}".' if obj.label else ""
    parts.append(f"{V.position_phrase(obj.position).capitalize()} there is a {obj.size} {obj.name}.{label}")
    if scene.is_clip:
      parts.append(f"The {obj.name} appears in frame {obj.appear_frame + 1}.")
      parts.append(f"The {obj.name} stays still." if obj.motion == "still" else f"The {obj.name} moves {obj.motion}.")
  relations = _relation_pairs(scene)
  if relations and rng.random() < 0.5:
    relations.pop(int(rng.integers(len(relations))))
  parts += [f"The {a} sits {r} the {b}." for a, r, b in relations]
  parts += [f"The {a} overlaps with the {b}." for a, b in _overlap_pairs(scene)]
  return " ".join(parts)


def _terse(scene: Scene, rng: np.random.Generator) -> str:
  names = [f"a {o.name}" for o in _order(scene, rng)]
  listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
  return f"{V.number_word(len(names)).capitalize()} shapes: {listed}."


def _invented_object(scene: Scene, rng: np.random.Generator) -> SceneObject:
  present = {o.name for o in scene.objects}
  kinds = [(c, s) for c in V.COLOURS for s in V.SHAPES if f"{c} {s}" not in present]
  colour, shape = kinds[int(rng.integers(len(kinds)))]
  return SceneObject(colour=colour, shape=shape, size=str(rng.choice(list(V.SIZES))), center=(0.5, 0.5), label=None)


def _hallucinating(scene: Scene, rng: np.random.Generator) -> str:
  objects = _order(scene, rng)
  ghost = _invented_object(scene, rng)
  taken = {o.position for o in scene.objects}
  free = [p for p in V.POSITIONS if p not in taken]
  ghost_position = free[int(rng.integers(len(free)))]
  parts = [f"The {_media(scene)} shows {len(objects) + 1} objects."]
  insert_at = int(rng.integers(len(objects) + 1))
  for i, obj in enumerate(objects):
    if i == insert_at:
      parts.append(f"A {ghost.size} {ghost.name} is {V.position_phrase(ghost_position)}.")
    label = obj.label
    if label and rng.random() < 0.5:
      label = next(str(w) for w in rng.permutation(V.LABELS) if w != obj.label)
    text = f', labelled "{label}"' if label else ""
    parts.append(f"A {obj.size} {obj.name} is {V.position_phrase(obj.position)}{text}.")
    if scene.is_clip:
      parts.append(f"The {obj.name} moves {obj.motion}." if obj.motion != "still" else f"The {obj.name} stays still.")
  if insert_at == len(objects):
    parts.append(f"A {ghost.size} {ghost.name} is {V.position_phrase(ghost_position)}.")
  return " ".join(parts)


def _spatially_confused(scene: Scene, rng: np.random.Generator) -> str:
  parts = []
  flip = {"left of": "right of", "right of": "left of", "above": "below", "below": "above"}
  for obj in _order(scene, rng):
    position = obj.position
    if rng.random() < 0.5:
      position = str(rng.choice([p for p in V.POSITIONS if p != obj.position]))
    parts.append(f"There is a {obj.size} {obj.name} at the {position}.")
  parts += [f"The {a} is {flip[r]} the {b}." for a, r, b in _relation_pairs(scene)]
  return " ".join(parts)


_POETIC_SIZE = {"small": "tiny", "medium": "medium-sized", "large": "big"}
_POETIC_POSITION = {
  "top left": "upper left",
  "top right": "upper right",
  "bottom left": "lower left",
  "bottom right": "lower right",
  "center": "middle",
}
_META = (
  "The composition feels balanced and striking.",
  "Overall the scene evokes a playful, minimalist mood.",
  "The arrangement creates a pleasing sense of depth.",
  "It is a charming and well-crafted picture.",
)


def _poetic(scene: Scene, rng: np.random.Generator) -> str:
  objects = _order(scene, rng)
  keep = max(1, int(np.ceil(len(objects) * 2 / 3)))
  parts = [str(rng.choice(_META))]
  for obj in objects[:keep]:
    size = _POETIC_SIZE[obj.size]
    position = _POETIC_POSITION.get(obj.position, obj.position)
    label = f' bearing the word "{obj.label}"' if obj.label else ""
    parts.append(f"A {size} {obj.name}{label} rests gracefully in the {position}.")
    if scene.is_clip and obj.motion != "still":
      parts.append(f"The {obj.name} drifts, moving {obj.motion}.")
  parts.append(str(rng.choice([m for m in _META if m != parts[0]])))
  return " ".join(parts)


def student_caption(scene: Scene, rng: np.random.Generator) -> str:
  """A weak base-model caption to synthesise rubrics against: misses objects, slips on a position, and
  sometimes adds meta-commentary (stands in for the policy's own first captions)."""
  objects = _order(scene, rng)
  keep = max(1, len(objects) // 2 + int(rng.integers(0, 2)))
  parts = []
  for i, obj in enumerate(objects[:keep]):
    position = obj.position
    if i == 0 and rng.random() < 0.5:
      position = str(rng.choice([p for p in V.POSITIONS if p != obj.position]))
    parts.append(f"There is a {obj.name} {V.position_phrase(position)}.")
  if rng.random() < 0.5:
    parts.append(str(rng.choice(_META)))
  return " ".join(parts)
