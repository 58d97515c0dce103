"""Decoder layers and ViT blocks run under lax.scan: the compiled program does not grow with depth, irregular
full-attention patterns still work; decoding with a KV cache runs the layers unrolled on per-layer buffers."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxcap.models as M
from jaxcap.models.vision import block_schedule, vision_layout


def _lowered_size(cfg) -> int:
  """Characters of the lowered (StableHLO) training-style forward + backward of `cfg`'s model."""
  return len(_lowered_text(cfg))


def _lowered_text(cfg) -> str:
  """The lowered (StableHLO) training-style forward + backward of `cfg`'s model."""
  graphdef, params = nnx.split(nnx.eval_shape(lambda: M.Qwen25VL(cfg, rngs=nnx.Rngs(0))))
  grid = np.asarray([[1, 4, 4]])
  layout = vision_layout(grid, cfg.vision)
  merged = 4
  ids = jnp.concatenate([jnp.full((1, merged), cfg.image_token_id), jnp.ones((1, 4), jnp.int32)], axis=1)
  pos = jnp.broadcast_to(jnp.arange(ids.shape[1])[None, None], (3, 1, ids.shape[1]))
  pixels = jax.ShapeDtypeStruct((16, cfg.vision.patch_dim), jnp.float32)

  def loss(params, pixels):
    logits, _ = nnx.merge(graphdef, params)(ids, pos, jnp.ones(ids.shape, bool), M.VisionInput(pixels, layout))
    return jnp.mean(logits)

  return jax.jit(jax.grad(loss)).lower(params, pixels).as_text()


def _deep(cfg, text_layers: int, vision_depth: int):
  full = tuple(range(1, vision_depth, 2))  # every second block, as tiny()'s (1, 3)
  return cfg.replace(
    text=dataclasses.replace(cfg.text, num_hidden_layers=text_layers),
    vision=dataclasses.replace(cfg.vision, depth=vision_depth, fullatt_block_indexes=full),
  )


def test_program_size_is_flat_in_depth():
  shallow = _lowered_size(_deep(M.tiny(), 2, 4))
  deep = _lowered_size(_deep(M.tiny(), 16, 32))
  assert deep < 1.1 * shallow, (shallow, deep)


@pytest.mark.parametrize(
  "depth,full,want",
  [
    (32, (7, 15, 23, 31), (8, [])),
    (4, (1, 3), (2, [])),
    (1, (0,), (1, [])),
    (3, (), (0, [(0, 3, False)])),
    (5, (1, 3), (0, [(0, 1, False), (1, 2, True), (2, 3, False), (3, 4, True), (4, 5, False)])),
    (4, (3, 9), (4, [])),  # indexes past the depth are ignored, as transformers does
  ],
)
def test_block_schedule(depth, full, want):
  assert block_schedule(depth, full) == want


@pytest.mark.slow
def test_irregular_full_attention_pattern_equals_unrolled_blocks():
  """A tower whose full-attention blocks are not periodic runs as scanned runs of blocks; it equals running the
  same stacked params block by block."""
  cfg = M.tiny().vision
  cfg = dataclasses.replace(cfg, depth=5, fullatt_block_indexes=(1, 3))
  tower = M.vision.VisionTower(cfg, rngs=nnx.Rngs(0))
  grid = np.asarray([[1, 8, 12], [1, 4, 4]])
  layout = vision_layout(grid, cfg)
  pixels = jax.random.normal(jax.random.key(1), (int(np.prod(grid, -1).sum()), cfg.patch_dim))
  got = tower(pixels, layout)

  graphdef, params = nnx.split(tower.blocks)
  unit = cfg.spatial_merge_size**2
  x = tower.patch_embed(pixels)
  x = x.reshape(-1, unit, x.shape[-1])[layout.window_index].reshape(x.shape)
  cos, sin = tower.rotary(layout.rotary_pos)
  for i in range(cfg.depth):
    block = nnx.merge(graphdef, jax.tree.map(lambda a: a[i], params))
    x = block(x, cos, sin, layout.frames if i in (1, 3) else layout.windows)
  want = tower.merger(x)[layout.reverse_index]
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)


def test_kv_cache_has_one_buffer_per_layer():
  cfg = M.tiny()
  cache = M.KVCache.zeros(cfg, batch=3, slots=10)
  t = cfg.text
  assert len(cache.k) == len(cache.v) == t.num_hidden_layers
  assert all(k.shape == (3, t.num_key_value_heads, t.head_dim, 10) for k in cache.k)  # keys transposed
  assert all(v.shape == (3, t.num_key_value_heads, 10, t.head_dim) for v in cache.v)
  assert cache.slots == 10


def _beyond_float32_scale(got, want, stages: int, what: str) -> list[str]:
  """[] if |got - want| <= stages x eps32 x max|want| elementwise, else what differs: two float32 evaluations of one
  function, each rounding (half an ulp, relative to the values it rounds) at each of `stages` dependent steps from
  the inputs to `want`, whose values are of the order of `want`'s largest (a sum near zero has no smaller error than
  its terms)."""
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  diff = np.abs(got - want)
  bound = stages * np.finfo(np.float32).eps * np.abs(want).max()
  if diff.max() <= bound:
    return []
  worst = np.unravel_index(np.argmax(diff), diff.shape)
  return [
    f"{what}: max |got - want| = {diff.max():.3g} at {tuple(map(int, worst))} (want {want[worst]:.6g}, "
    f"got {got[worst]:.6g}) > {stages} x eps32 x max|want| = {bound:.3g}"
  ]


@pytest.mark.slow
def test_unrolled_stacks_compute_the_same_function():
  """`scan_layers=False` unrolls the same stacked params in the compiled program: same logits and gradients up to
  float32 rounding. The two programs fuse and accumulate differently (XLA:CPU picks its kernels by the CPU's
  features), so a gradient element that is a near-cancelling sum differs beyond a fixed elementwise tolerance on some
  hosts (1.1e-5 on a v_proj element of -4.2e-3 whose 33 terms sum to 18 in magnitude: 5 eps of the terms, 0.3 eps
  of the leaf's largest), so each leaf is compared at its own float32 scale (`_beyond_float32_scale`)."""
  cfg = M.tiny()
  model = M.Qwen25VL(cfg, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model)
  unrolled, unrolled_params = nnx.split(M.Qwen25VL(cfg.replace(scan_layers=False), rngs=nnx.Rngs(0)))
  # exact: the unrolled model stacks the same params, bitwise (the comparison below runs both on `params`)
  jax.tree.map(np.testing.assert_array_equal, unrolled_params, params)
  grid = np.asarray([[1, 8, 12], [1, 4, 4]])
  layout = vision_layout(grid, cfg.vision)
  pixels = jax.random.normal(jax.random.key(1), (int(np.prod(grid, -1).sum()), cfg.vision.patch_dim))
  n = int(np.prod(grid, -1).sum()) // 4
  ids = jnp.concatenate([jnp.full((1, n), cfg.image_token_id), jnp.arange(1, 6)[None]], axis=1)
  pos = jnp.broadcast_to(jnp.arange(ids.shape[1])[None, None], (3, 1, ids.shape[1]))

  def loss(graph, params):
    logits, _ = nnx.merge(graph, params)(ids, pos, jnp.ones(ids.shape, bool), M.VisionInput(pixels, layout))
    return jnp.sum(jnp.tanh(logits)), logits

  (_, want), want_g = jax.value_and_grad(lambda p: loss(graphdef, p), has_aux=True)(params)
  (_, got), got_g = jax.value_and_grad(lambda p: loss(unrolled, p), has_aux=True)(params)
  # Dependent float32 steps: 9 per layer (2 norms, the q/k/v, score, softmax, value and output products, the two MLP
  # products), over the vision blocks, the decoder layers and 3 more (patch embedding, merger, LM head); the
  # gradients go through them forward and back. Two evaluations, each within half an ulp per step: 2 x 1/2 = 1 eps
  # per step. (Measured here: 2.5 eps of the logits' largest, 5.3 eps of a leaf's largest.)
  forward = 9 * (cfg.vision.depth + cfg.text.num_hidden_layers + 3)
  differ = _beyond_float32_scale(got, want, forward, "logits")
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got_g), jax.tree.leaves(want_g), strict=True):
    differ += _beyond_float32_scale(a, b, 2 * forward, f"gradient {jax.tree_util.keystr(path)}")
  assert not differ, "\n".join(differ)
  # unrolled: no loop left in the program (the scanned one loops over the stacks)
  assert _lowered_text(cfg.replace(scan_layers=False)).count("stablehlo.while") == 0
  assert _lowered_text(cfg).count("stablehlo.while") > 0
