import time

import numpy as np
import pytest

from jaxcap.world.render import render_clip, render_frame
from jaxcap.world import vocabulary as V
from jaxcap.world.scene import Scene, SceneObject, WorldConfig, position_of, sample_scene


def test_same_seed_same_scene_and_pixels():
  a = sample_scene(np.random.default_rng(5), "s", WorldConfig(), clip=True)
  b = sample_scene(np.random.default_rng(5), "s", WorldConfig(), clip=True)
  c = sample_scene(np.random.default_rng(6), "s", WorldConfig(), clip=True)
  assert a == b and a != c
  assert [f.tobytes() for f in render_clip(a)] == [f.tobytes() for f in render_clip(b)]


def test_scene_invariants_hold_over_many_seeds():
  for seed in range(200):
    scene = sample_scene(np.random.default_rng(seed), "s", WorldConfig(max_objects=6))
    names = [o.name for o in scene.objects]
    assert len(set(names)) == len(names), "objects must be unique by colour and shape"
    positions = [o.position for o in scene.objects]
    assert len(set(positions)) == len(positions), "objects occupy distinct grid cells"
    assert Scene.from_graph(scene.to_graph()) == scene


@pytest.mark.parametrize("size", [64, 128, 224])
def test_rendering_size_and_speed(size):
  scene = sample_scene(np.random.default_rng(0), "s", WorldConfig(image_size=size))
  start = time.perf_counter()
  for _ in range(20):
    image = render_frame(scene, 0, size)
  assert (time.perf_counter() - start) / 20 < 0.02  # milliseconds per image
  assert image.size == (size, size) and image.mode == "RGB"
  one = Scene("one", (SceneObject("red", "star", "large", (0.5, 0.5)),), "teal")
  pixels = np.asarray(render_frame(one, 0, size))
  assert tuple(pixels[size // 2, size // 2]) == V.COLOURS["red"]
  assert tuple(pixels[0, 0]) == V.BACKGROUNDS["teal"]


def test_clip_objects_appear_late_and_move_in_their_direction():
  config = WorldConfig(num_frames=6)
  scenes = [sample_scene(np.random.default_rng(s), "c", config, clip=True) for s in range(30)]
  moved = 0
  for scene in scenes:
    frames = render_clip(scene, 96)
    assert len(frames) == scene.num_frames == 6
    for obj in scene.objects:
      assert 0 <= obj.appear_frame < scene.num_frames - 1
      start, end = obj.center_at(obj.appear_frame), obj.center_at(scene.num_frames - 1)
      dx, dy = end[0] - start[0], end[1] - start[1]
      expected = {"left": dx < 0, "right": dx > 0, "up": dy < 0, "down": dy > 0, "still": dx == dy == 0}
      assert expected[obj.motion], (obj.motion, dx, dy)
      assert 0 < end[0] < 1 and 0 < end[1] < 1
      moved += obj.motion != "still"
    late = [o for o in scene.objects if o.appear_frame > 0]
    if late:  # absent before it appears: frame 0 differs from the frame where it shows up
      o = late[0]
      assert frames[0].tobytes() != frames[o.appear_frame].tobytes()
  assert moved > 10


def test_position_grid():
  assert position_of((0.1, 0.1)) == "top left" and position_of((0.5, 0.5)) == "center"
  assert position_of((0.9, 0.5)) == "right" and position_of((0.5, 0.95)) == "bottom"


def test_bad_config_names_the_fix():
  with pytest.raises(ValueError, match="image_size"):
    WorldConfig(image_size=16)
  with pytest.raises(ValueError, match="3x3 grid"):
    WorldConfig(max_objects=9)
