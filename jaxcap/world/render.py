"""Pillow rendering of scenes (one image) and clips (one image per frame)."""

from __future__ import annotations

import math

from PIL import Image, ImageDraw, ImageFont

from jaxcap.world import vocabulary as V
from jaxcap.world.scene import Scene, SceneObject


def render_frame(scene: Scene, frame: int = 0, image_size: int = 128) -> Image.Image:
  """RGB image [image_size, image_size] of `scene` at `frame`; objects not yet appeared are absent."""
  image = Image.new("RGB", (image_size, image_size), V.BACKGROUNDS[scene.background])
  draw = ImageDraw.Draw(image)
  font = ImageFont.load_default()
  # Larger objects first so small ones stay visible where they overlap.
  for obj in sorted(scene.objects, key=lambda o: -o.radius):
    if frame < obj.appear_frame:
      continue
    _draw_object(draw, obj, frame, image_size, font)
  return image


def render_clip(scene: Scene, image_size: int = 128) -> list[Image.Image]:
  """One RGB image per frame, len == scene.num_frames."""
  return [render_frame(scene, t, image_size) for t in range(scene.num_frames)]


def _draw_object(draw: ImageDraw.ImageDraw, obj: SceneObject, frame: int, size: int, font) -> None:
  cx, cy = obj.center_at(frame)
  cx, cy, r = cx * size, cy * size, obj.radius * size
  fill = V.COLOURS[obj.colour]
  outline = (0, 0, 0) if obj.colour != "black" else (255, 255, 255)
  box = (cx - r, cy - r, cx + r, cy + r)
  if obj.shape == "circle":
    draw.ellipse(box, fill=fill, outline=outline)
  elif obj.shape == "square":
    draw.rectangle((cx - 0.85 * r, cy - 0.85 * r, cx + 0.85 * r, cy + 0.85 * r), fill=fill, outline=outline)
  elif obj.shape == "triangle":
    draw.polygon([(cx, cy - r), (cx - r, cy + 0.8 * r), (cx + r, cy + 0.8 * r)], fill=fill, outline=outline)
  elif obj.shape == "diamond":
    draw.polygon([(cx, cy - r), (cx + r, cy), (cx, cy + r), (cx - r, cy)], fill=fill, outline=outline)
  elif obj.shape == "star":
    points = []
    for k in range(10):
      radius = r if k % 2 == 0 else 0.45 * r
      angle = -math.pi / 2 + k * math.pi / 5
      points.append((cx + radius * math.cos(angle), cy + radius * math.sin(angle)))
    draw.polygon(points, fill=fill, outline=outline)
  else:
    raise ValueError(f"Unknown shape {obj.shape!r}; known shapes are {V.SHAPES}.")
  if obj.label:
    text_colour = (0, 0, 0) if sum(fill) > 380 else (255, 255, 255)
    left, top, right, bottom = draw.textbbox((0, 0), obj.label, font=font)
    draw.text((cx - (right - left) / 2, cy - (bottom - top) / 2), obj.label, fill=text_colour, font=font)
