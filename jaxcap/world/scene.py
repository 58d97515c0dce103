"""Procedural scenes and clips: the ground truth of the synthetic world.

Coordinates are normalised to [0, 1] with y pointing down. A clip is a scene whose objects appear at a
frame index and move with a constant velocity; a still image is a clip of one frame.
Objects are unique by (colour, shape) and sit in distinct cells of a 3x3 grid, so "the red circle" and
"the circle in the top left" each name exactly one object.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from jaxcap.world import vocabulary as V

# Two centres closer than this along an axis are "level" on it: no left/right (or above/below) relation
# is stated in references or asked in questions, so ground truth is never a coin flip.
DECISIVE_MARGIN = 0.15
# Total displacement of a moving object over a clip, as a fraction of the image side.
MOTION_DISTANCE = 0.2


@dataclasses.dataclass(frozen=True)
class WorldConfig:
  """Knobs of the procedural generator. Image sizes are pixels; everything else is unitless."""

  image_size: int = 128
  min_objects: int = 2
  max_objects: int = 5
  label_probability: float = 0.4
  clip_fraction: float = 0.0  # fraction of scenes that are clips (video) rather than stills
  num_frames: int = 6  # frames per clip

  def __post_init__(self):
    if not 64 <= self.image_size <= 1024:
      raise ValueError(f"WorldConfig.image_size={self.image_size}: use 64..1024 pixels.")
    if not 1 <= self.min_objects <= self.max_objects <= 6:
      raise ValueError(
        f"WorldConfig objects {self.min_objects}..{self.max_objects}: need 1 <= min <= max <= 6 "
        "(objects occupy distinct cells of a 3x3 grid and must leave room for distractors)."
      )
    if self.num_frames < 2:
      raise ValueError(f"WorldConfig.num_frames={self.num_frames}: a clip needs at least 2 frames.")


@dataclasses.dataclass(frozen=True)
class SceneObject:
  """One object. `center` is its centre at `appear_frame`; it moves by `velocity` per frame."""

  colour: str
  shape: str
  size: str
  center: tuple[float, float]
  label: str | None = None
  motion: str = "still"
  appear_frame: int = 0
  velocity: tuple[float, float] = (0.0, 0.0)

  @property
  def name(self) -> str:
    """Canonical name, e.g. "red circle"; unique within a scene."""
    return f"{self.colour} {self.shape}"

  @property
  def radius(self) -> float:
    return V.SIZES[self.size] / 2

  @property
  def position(self) -> str:
    """Grid cell of the centre when the object first appears."""
    return position_of(self.center)

  def center_at(self, frame: int) -> tuple[float, float]:
    steps = max(0, frame - self.appear_frame)
    return (self.center[0] + steps * self.velocity[0], self.center[1] + steps * self.velocity[1])


@dataclasses.dataclass(frozen=True)
class Scene:
  """A still image (num_frames == 1) or a clip, with its background colour name."""

  id: str
  objects: tuple[SceneObject, ...]
  background: str
  num_frames: int = 1

  @property
  def is_clip(self) -> bool:
    return self.num_frames > 1

  def find(self, name: str) -> SceneObject | None:
    for obj in self.objects:
      if obj.name == name:
        return obj
    return None

  def relation_holds(self, subject: str, relation: str, other: str, margin: float = 0.0) -> bool:
    """Whether `subject relation other` is true of the initial centres, e.g. ("red circle", "left of", ...)."""
    a, b = self.find(subject), self.find(other)
    if a is None or b is None or a is b:
      return False
    dx, dy = b.center[0] - a.center[0], b.center[1] - a.center[1]
    return {"left of": dx > margin, "right of": -dx > margin, "above": dy > margin, "below": -dy > margin}[relation]

  def overlaps(self, first: str, second: str) -> bool:
    """Whether the two objects' discs intersect at their initial centres."""
    a, b = self.find(first), self.find(second)
    if a is None or b is None or a is b:
      return False
    distance = np.hypot(a.center[0] - b.center[0], a.center[1] - b.center[1])
    return bool(distance < a.radius + b.radius)

  def decisive_relation(self, subject: str, other: str) -> str | None:
    """The single dominant-axis relation of subject to other, or None when it is not clear-cut."""
    a, b = self.find(subject), self.find(other)
    dx, dy = b.center[0] - a.center[0], b.center[1] - a.center[1]
    if abs(dx) > DECISIVE_MARGIN and abs(dy) < abs(dx) / 2:
      return "left of" if dx > 0 else "right of"
    if abs(dy) > DECISIVE_MARGIN and abs(dx) < abs(dy) / 2:
      return "above" if dy > 0 else "below"
    return None

  def to_graph(self) -> dict[str, Any]:
    """The ground-truth scene graph as plain JSON-able data."""
    names = [o.name for o in self.objects]
    relations = [
      {"subject": a, "relation": r, "object": b}
      for a in names
      for b in names
      if a != b
      for r in ("left of", "above")
      if self.relation_holds(a, r, b, DECISIVE_MARGIN)
    ]
    overlaps = [[a, b] for i, a in enumerate(names) for b in names[i + 1 :] if self.overlaps(a, b)]
    return {
      "id": self.id,
      "background": self.background,
      "num_frames": self.num_frames,
      "objects": [dict(dataclasses.asdict(o), name=o.name, position=o.position) for o in self.objects],
      "relations": relations,
      "overlaps": overlaps,
    }

  @classmethod
  def from_graph(cls, graph: dict[str, Any]) -> "Scene":
    fields = {f.name for f in dataclasses.fields(SceneObject)}
    objects = []
    for o in graph["objects"]:
      kwargs = {k: v for k, v in o.items() if k in fields}
      kwargs["center"] = tuple(kwargs["center"])
      kwargs["velocity"] = tuple(kwargs.get("velocity", (0.0, 0.0)))
      objects.append(SceneObject(**kwargs))
    return cls(
      id=graph["id"], objects=tuple(objects), background=graph["background"], num_frames=int(graph.get("num_frames", 1))
    )


def position_of(center: tuple[float, float]) -> str:
  """Grid-cell name of a normalised point."""
  col = min(2, max(0, int(center[0] * 3)))
  row = min(2, max(0, int(center[1] * 3)))
  return V.POSITIONS[3 * row + col]


def sample_scene(
  rng: np.random.Generator, scene_id: str, config: WorldConfig = WorldConfig(), clip: bool = False
) -> Scene:
  """Draws one scene (or clip) from `rng`; the same generator state gives the same scene."""
  n = int(rng.integers(config.min_objects, config.max_objects + 1))
  kinds = [(c, s) for c in V.COLOURS for s in V.SHAPES]
  chosen = rng.choice(len(kinds), size=n, replace=False)
  cells = rng.choice(9, size=n, replace=False)
  labels = [str(w) for w in rng.permutation(V.LABELS)]
  num_frames = config.num_frames if clip else 1
  # Objects enter during the first half of a clip so that each has frames left to move in.
  appear = rng.integers(0, num_frames // 2 + 1, size=n) if clip else [0] * n
  objects = []
  for i, (k, cell) in enumerate(zip(chosen, cells)):
    colour, shape = kinds[int(k)]
    row, col = divmod(int(cell), 3)
    # Jitter inside the cell but keep a margin so the centre's cell is unambiguous.
    x = (col + 0.5 + rng.uniform(-0.25, 0.25)) / 3
    y = (row + 0.5 + rng.uniform(-0.25, 0.25)) / 3
    label = labels.pop() if rng.random() < config.label_probability else None
    motion, velocity = "still", (0.0, 0.0)
    if clip:
      motion, velocity = _sample_motion(rng, (x, y), num_frames - int(appear[i]) - 1)
    objects.append(
      SceneObject(
        colour=colour,
        shape=shape,
        size=str(rng.choice(list(V.SIZES))),
        center=(float(x), float(y)),
        label=label,
        motion=motion,
        appear_frame=int(appear[i]) if clip else 0,
        velocity=velocity,
      )
    )
  background = str(rng.choice(list(V.BACKGROUNDS)))
  return Scene(id=scene_id, objects=tuple(objects), background=background, num_frames=num_frames)


def _sample_motion(rng: np.random.Generator, center: tuple[float, float], steps: int):
  """A direction with room to travel MOTION_DISTANCE inside the frame, or "still"."""
  x, y = center
  room = {"left": x - 0.1, "right": 0.9 - x, "up": y - 0.1, "down": 0.9 - y}
  feasible = [m for m, r in room.items() if r >= MOTION_DISTANCE] + ["still"]
  motion = str(rng.choice(feasible))
  if motion == "still" or steps <= 0:
    return "still", (0.0, 0.0)
  speed = MOTION_DISTANCE / steps
  unit = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}[motion]
  return motion, (unit[0] * speed, unit[1] * speed)


def as_scenes(scenes: Mapping[str, Any]) -> dict[str, Scene]:
  """id -> Scene from a manifest's scene graphs (`Manifest.scenes`) or Scenes already built; a graph that does not
  parse raises a ValueError naming its id."""
  out = {}
  for key, scene in scenes.items():
    try:
      out[key] = Scene.from_graph(scene) if isinstance(scene, Mapping) else scene  # Scenes (or stand-ins) as they are
    except (KeyError, TypeError, ValueError) as e:
      raise ValueError(f"scene {key!r}: not a scene graph of the synthetic world ({type(e).__name__}: {e})") from e
  return out
