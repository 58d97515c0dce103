"""The synthetic world's controlled vocabulary: colours, shapes, sizes, grid positions, labels, motions.

Every caption, question and claim in the world is built from these words, which is what lets the
rule-based judge parse captions deterministically. Synonyms map to one canonical word each.
"""

from __future__ import annotations

COLOURS: dict[str, tuple[int, int, int]] = {
  "red": (220, 40, 40),
  "green": (40, 170, 60),
  "blue": (40, 80, 220),
  "yellow": (235, 210, 40),
  "purple": (140, 60, 180),
  "orange": (245, 140, 30),
  "black": (20, 20, 20),
  "white": (250, 250, 250),
}

BACKGROUNDS: dict[str, tuple[int, int, int]] = {
  "grey": (150, 150, 150),
  "beige": (225, 210, 180),
  "teal": (60, 140, 140),
}

SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "diamond", "star")

# Diameter of an object as a fraction of the image side.
SIZES: dict[str, float] = {"small": 0.14, "medium": 0.2, "large": 0.28}

# 3x3 grid, row-major; the name of cell (row, col) is POSITIONS[3 * row + col].
POSITIONS: tuple[str, ...] = (
  "top left",
  "top",
  "top right",
  "left",
  "center",
  "right",
  "bottom left",
  "bottom",
  "bottom right",
)

LABELS: tuple[str, ...] = ("EXIT", "SALE", "OPEN", "CAT", "SUN", "42", "GO", "BUS", "STOP", "ZOO", "MAP", "7")

MOTIONS: tuple[str, ...] = ("left", "right", "up", "down", "still")

RELATIONS: tuple[str, ...] = ("left of", "right of", "above", "below")

NUMBER_WORDS: dict[str, int] = {
  "zero": 0,
  "one": 1,
  "two": 2,
  "three": 3,
  "four": 4,
  "five": 5,
  "six": 6,
  "seven": 7,
  "eight": 8,
  "nine": 9,
  "ten": 10,
}

SIZE_SYNONYMS: dict[str, str] = {
  "small": "small",
  "tiny": "small",
  "little": "small",
  "medium": "medium",
  "medium-sized": "medium",
  "mid-sized": "medium",
  "large": "large",
  "big": "large",
  "huge": "large",
}

SHAPE_SYNONYMS: dict[str, str] = {s: s for s in SHAPES} | {"ring": "circle", "rhombus": "diamond"}

COLOUR_SYNONYMS: dict[str, str] = {c: c for c in COLOURS} | {"violet": "purple"}

POSITION_SYNONYMS: dict[str, str] = {p: p for p in POSITIONS} | {
  "upper left": "top left",
  "upper right": "top right",
  "lower left": "bottom left",
  "lower right": "bottom right",
  "centre": "center",
  "middle": "center",
  "top-left": "top left",
  "top-right": "top right",
  "bottom-left": "bottom left",
  "bottom-right": "bottom right",
}

MOTION_SYNONYMS: dict[str, str] = {
  "left": "left",
  "to the left": "left",
  "leftward": "left",
  "leftwards": "left",
  "right": "right",
  "to the right": "right",
  "rightward": "right",
  "rightwards": "right",
  "up": "up",
  "upward": "up",
  "upwards": "up",
  "down": "down",
  "downward": "down",
  "downwards": "down",
}


def plural(shape: str) -> str:
  """English plural of a shape noun ("circle" -> "circles")."""
  return shape + "s"


def number_word(n: int) -> str:
  """Spell small counts the way teachers do ("3" -> "three")."""
  inverse = {v: k for k, v in NUMBER_WORDS.items()}
  return inverse.get(n, str(n))


def position_phrase(position: str) -> str:
  """Prepositional phrase for a grid cell: "in the top left", "on the left", "at the top", "in the center"."""
  if position in ("left", "right"):
    return f"on the {position}"
  if position in ("top", "bottom"):
    return f"at the {position}"
  return f"in the {position}"
