"""The embedded student's vision warm-up: exact per-cell targets, and a random ViT that learns to see colours."""

import jax
import numpy as np
import pytest
from flax import nnx

from jaxcap.world import vocabulary as V
from jaxcap.world.scene import Scene, SceneObject, WorldConfig
from jaxcap.models.config import VisionConfig
from jaxcap.models.vision import VisionTower
from jaxcap.sharding import make_mesh
from jaxcap.world.vision_warmup import ATTRIBUTES, cell_targets, fresh_scenes, warm_up_vision


def test_cell_targets_name_the_object_centred_in_each_cell():
  scene = Scene(
    "s",
    (
      SceneObject("red", "star", "large", (0.1, 0.9)),  # bottom left = cell 6 of 3x3
      SceneObject("blue", "circle", "small", (0.55, 0.4)),  # center = cell 4
      SceneObject("green", "square", "medium", (0.9, 0.1), appear_frame=2),
    ),  # not in frame 0
    "grey",
  )
  t = cell_targets(scene, 3, 3)
  want = np.zeros((9, 3), np.int32)
  want[6] = [1 + list(V.COLOURS).index("red"), 1 + V.SHAPES.index("star"), 1 + list(V.SIZES).index("large")]
  want[4] = [1 + list(V.COLOURS).index("blue"), 1 + V.SHAPES.index("circle"), 1 + list(V.SIZES).index("small")]
  np.testing.assert_array_equal(t, want)
  assert list(ATTRIBUTES) == ["colour", "shape", "size"]
  # On a 2x4 token grid the same centres land in (row 1, col 0) and (row 0, col 2).
  t = cell_targets(scene, 2, 4)
  assert t[4, 0] == want[6, 0] and t[2, 0] == want[4, 0] and (t[[0, 1, 3, 5, 6, 7]] == 0).all()


def test_fresh_scenes_are_a_deterministic_stream_of_preprocessed_stills():
  world = WorldConfig(image_size=84, min_objects=1, max_objects=2, label_probability=0.0)
  a = fresh_scenes(world, seed=3, start=0, count=6)
  b = fresh_scenes(world, seed=3, start=4, count=2)
  assert a.pixels.shape == (6, 36, 1176) and a.targets.shape == (6, 9, 3) and tuple(a.grid_thw) == (1, 6, 6)
  np.testing.assert_array_equal(a.pixels[4:], b.pixels)  # scene i is the same whatever else is drawn
  np.testing.assert_array_equal(a.targets[4:], b.targets)
  assert ((a.targets[..., 0] > 0).sum(1) >= 1).all() and ((a.targets[..., 0] > 0).sum(1) <= 2).all()
  assert not np.array_equal(a.pixels, fresh_scenes(world, seed=4, start=0, count=6).pixels)
  resized = fresh_scenes(world, seed=3, start=0, count=1, image_size=112)
  assert resized.targets.shape == (1, 16, 3) and tuple(resized.grid_thw) == (1, 8, 8)  # 4x4 cells at 112 px


@pytest.mark.slow
def test_warm_up_teaches_a_random_vit_object_colours():
  world = WorldConfig(image_size=84, min_objects=1, max_objects=2, label_probability=0.0)
  heldout = fresh_scenes(world, seed=1, start=0, count=128)
  batches = lambda step: fresh_scenes(world, seed=0, start=32 * step, count=32)
  cfg = VisionConfig(
    depth=1, hidden_size=64, intermediate_size=128, num_heads=2, out_hidden_size=64, fullatt_block_indexes=(0,)
  )
  tower = VisionTower(cfg, rngs=nnx.Rngs(0))
  before = jax.tree.leaves(jax.tree.map(np.asarray, nnx.state(tower)))
  mesh = make_mesh({"data": 1, "fsdp": -1, "tensor": 1})
  logged = []
  _, untrained = warm_up_vision(tower, batches, heldout, steps=0, lr=3e-3, seed=0, mesh=mesh)
  state, trained = warm_up_vision(
    tower, batches, heldout, steps=150, lr=3e-3, seed=0, mesh=mesh, log=lambda s, m: logged.append(m)
  )
  # chance over 8 colours is 1/8, and the untrained heads are near it
  assert untrained["vision/colour_acc"] < 0.3 and trained["vision/colour_acc"] > 0.8, (untrained, trained)
  assert trained["vision/size_acc"] > untrained["vision/size_acc"] + 0.2
  assert logged[-1]["loss"] < 0.5 * logged[0]["loss"]
  after = jax.tree.leaves(state)
  assert [x.shape for x in before] == [np.shape(y) for y in after]
  assert all(not np.allclose(x, y) for x, y in zip(before, after))  # every tower parameter learned
