"""Attention segments of the vision tower: the tiled fast path (a reshape) equals the gather path exactly."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

import jaxcap.models as M
from jaxcap.models.vision import LayoutShape, VisionTower, stack_layouts, vision_layout


def _untiled(layout):
  untile = lambda b: dataclasses.replace(b, tiled=False)
  return dataclasses.replace(layout, windows=untile(layout.windows), frames=untile(layout.frames))


@pytest.mark.parametrize(
  "grid, windows_tiled, frames_tiled",
  [
    ([[1, 8, 8], [1, 8, 8]], True, True),  # tiny: a window is 4x4 patches; same-size images
    ([[1, 8, 8], [1, 8, 12]], True, False),  # whole windows, frames of two lengths
    ([[1, 6, 8]], False, True),  # a partial window row, one frame
    ([[2, 8, 8]], True, True),  # a two-frame video
  ],
)
def test_tiled_blocks_are_detected_and_equal_the_gather_path(grid, windows_tiled, frames_tiled):
  cfg = M.tiny().vision
  grid = np.asarray(grid)
  layout = vision_layout(grid, cfg)
  assert (layout.windows.tiled, layout.frames.tiled) == (windows_tiled, frames_tiled)
  tower = VisionTower(cfg, rngs=nnx.Rngs(0))
  pixels = jax.random.normal(jax.random.key(1), (int(np.prod(grid, -1).sum()), cfg.patch_dim))
  got = jax.jit(lambda p, lay: tower(p, lay))(pixels, layout)
  want = jax.jit(lambda p, lay: tower(p, lay))(pixels, _untiled(layout))
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)


def test_padded_layouts_are_not_tiled_and_stacking_keeps_one_program():
  cfg = M.tiny().vision
  exact = vision_layout(np.asarray([[1, 8, 8]]), cfg)
  padded = vision_layout(np.asarray([[1, 8, 8]]), cfg, LayoutShape(128, 8, 16, 2, 64))
  assert exact.windows.tiled and not padded.windows.tiled and not padded.frames.tiled
  # micro-batches share one program: the stack is tiled only where every layout is
  for pair in ([exact, _untiled(exact)], [_untiled(exact), exact]):
    stacked = stack_layouts(pair)
    assert not stacked.windows.tiled and not stacked.frames.tiled
    assert jax.tree.structure(stacked) == jax.tree.structure(stack_layouts([_untiled(exact)] * 2))
  assert stack_layouts([exact, exact]).windows.tiled


def test_tiled_split_and_join_round_trip():
  cfg = M.tiny().vision
  blocks = vision_layout(np.asarray([[1, 8, 8], [1, 8, 8]]), cfg).windows
  x = np.arange(128 * 3, dtype=np.float32).reshape(128, 3)
  assert blocks.tiled
  np.testing.assert_array_equal(np.asarray(blocks.split(x)), x[blocks.gather])
  np.testing.assert_array_equal(np.asarray(blocks.join(blocks.split(x))), x)
