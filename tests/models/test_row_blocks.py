"""Row-block weights for few-row matmuls (decode steps on CPU): layout, exact products, where they apply, and a
decode step through them equal to one through the plain [in, out] kernels."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxcap.models import KVCache, Qwen25VL, row_blocks, tiny
from jaxcap.models.layers import linear
from jaxcap.sharding import make_mesh


@pytest.mark.parametrize(
  "out, blocks",
  [(32000, 125), (11008, 43), (18944, 74), (151936, 1187), (2752, 16), (256, 1), (64, 1), (257, 1), (1, 1)],
)
def test_block_count_tiles_the_rows_nearest_the_block_height(out, blocks):
  # 151936 = 2^7 x 1187: blocks of 128 rows (|128 - 256| < |1187 - 256|); 257 is prime: one block of 257
  assert row_blocks.block_count(out) == blocks
  assert out % blocks == 0


def test_layouts_hold_the_weight_rows_in_order():
  w = jnp.arange(2752 * 3, dtype=jnp.float32).reshape(3, 2752)  # a kernel [in=3, out=2752]
  blocks = row_blocks.from_kernel(w)
  assert blocks.shape == (16, 172, 3)  # 2752 = 2^6 x 43
  np.testing.assert_array_equal(blocks.reshape(2752, 3), w.T)
  np.testing.assert_array_equal(row_blocks.from_rows(w.T), blocks)


@pytest.mark.parametrize("rows", [1, 8, 32, 64])
def test_matmul_equals_the_plain_dot(rows):
  rng = np.random.default_rng(rows)
  x = jnp.asarray(rng.standard_normal((rows, 96), np.float32))
  kernel = jnp.asarray(rng.standard_normal((96, 1000), np.float32))
  got = row_blocks.matmul(x, row_blocks.from_kernel(kernel))
  assert got.shape == (rows, 1000)
  np.testing.assert_allclose(got, x @ kernel, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_linear_with_row_block_kernel_equals_plain(dtype):
  layer = linear(64, 300, bias=True, dtype=dtype, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
  layer.bias[...] = jnp.linspace(-1, 1, 300)
  x = jax.random.normal(jax.random.key(1), (2, 3, 64), dtype)
  plain = layer(x)
  layer.kernel = nnx.Param(row_blocks.from_kernel(layer.kernel[...]))
  blocked = layer(x)
  assert blocked.shape == plain.shape == (2, 3, 300) and blocked.dtype == plain.dtype == dtype
  tol = 1e-5 if dtype == jnp.float32 else 2e-2
  np.testing.assert_allclose(np.asarray(blocked, np.float32), np.asarray(plain, np.float32), rtol=tol, atol=tol)


@pytest.mark.slow
def test_applies_to_few_rows_on_one_device_only():
  model = Qwen25VL(tiny(), rngs=nnx.Rngs(0))
  kernels = lambda layers: {a.ndim for p, a in jax.tree_util.tree_leaves_with_path(layers[0]) if "kernel" in str(p)}
  assert kernels(model.layer_params(row_blocks.MAX_ROWS)) == {3}
  assert kernels(model.layer_params(row_blocks.MAX_ROWS + 1)) == {2}
  assert kernels(model.layer_params()) == {2}
  assert model.head_params(row_blocks.MAX_ROWS + 1) is None
  with jax.set_mesh(make_mesh({"fsdp": -1})):  # the tests' 8 host devices: sharded weights keep their layout
    assert jax.device_count() > 1
    assert kernels(model.layer_params(8)) == {2}
    assert model.head_params(8) is None


@pytest.mark.parametrize("tie", [True, False])
def test_decode_step_through_row_blocks_equals_plain(tie):
  cfg = tiny()
  cfg = dataclasses.replace(cfg, text=dataclasses.replace(cfg.text, tie_word_embeddings=tie))
  model = Qwen25VL(cfg, rngs=nnx.Rngs(0))
  rows, prompt = 6, 5
  rng = np.random.default_rng(0)
  ids = jnp.asarray(rng.integers(0, 200, (rows, prompt)))
  pos = jnp.broadcast_to(jnp.arange(prompt)[None, None], (3, rows, prompt))
  cache = KVCache.zeros(cfg, rows, prompt + 1)
  mask = jnp.ones((rows, prompt), bool)
  _, cache = model.decode(model.embed(ids), pos, jnp.pad(mask, ((0, 0), (0, 1))), cache, 0)
  step = jnp.asarray(rng.integers(0, 200, (rows, 1)))
  step_pos = jnp.full((3, rows, 1), prompt)
  slots = jnp.ones((rows, prompt + 1), bool)

  def one_step(layers, head):
    hidden, _ = model.decode(model.embed(step), step_pos, slots, cache, prompt, layers=layers)
    return model.logits(hidden[:, 0], head)

  plain = one_step(model.layer_params(), None)
  head = model.head_params(rows)
  assert head is not None and head.ndim == 3
  blocked = one_step(model.layer_params(rows), head)
  assert blocked.shape == plain.shape == (rows, cfg.text.vocab_size)
  np.testing.assert_allclose(blocked, plain, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(jnp.argmax(blocked, -1), jnp.argmax(plain, -1))


def _decode_temp_bytes(cfg) -> int:
  """Temporary bytes of the compiled greedy decode program for 2 rows (abstract weights: nothing allocated)."""
  import functools

  from jaxcap.sampling import generate
  from jaxcap.sampling.distribution import SamplingConfig
  from jaxcap.sampling.prompts import Prompts

  graphdef, params = nnx.split(nnx.eval_shape(lambda: Qwen25VL(cfg, rngs=nnx.Rngs(0))))
  rows, t = 2, 16
  spec = jax.ShapeDtypeStruct
  prompts = Prompts(
    spec((rows, t), jnp.int32), spec((rows, t), jnp.bool_), spec((3, rows, t), jnp.int32), spec((rows,), jnp.int32)
  )
  static = generate.static_arguments(graphdef, SamplingConfig(max_new_tokens=4), cfg.eos_token_id, 0)
  key = spec((2,), jnp.uint32)
  state = jax.eval_shape(functools.partial(generate.prefill, num_samples=1, **static), params, prompts, key)
  return generate.decode_jit.lower(params, state, **static).compile().memory_analysis().temp_size_in_bytes


@pytest.mark.slow
def test_bf16_decode_holds_one_layers_float32_weights_at_a_time():
  """XLA:CPU computes bf16 dots in float32; the decode program converts one layer's weights at a time
  (`row_blocks.in_step`), so each layer adds its row-block copy (2 bytes per weight) to the program's temporaries,
  not that plus a float32 copy (6 bytes per weight before)."""
  base = tiny()
  text = dict(hidden_size=256, intermediate_size=1024, num_attention_heads=4, mrope_section=(8, 12, 12))
  cfgs = [
    base.replace(
      param_dtype=jnp.bfloat16, dtype=jnp.bfloat16, text=dataclasses.replace(base.text, num_hidden_layers=n, **text)
    )
    for n in (2, 4)
  ]
  two, four = (_decode_temp_bytes(c) for c in cfgs)
  t = cfgs[0].text
  kv = t.num_key_value_heads * t.head_dim
  weights = t.hidden_size * (2 * t.hidden_size + 2 * kv) + 3 * t.hidden_size * t.intermediate_size  # one layer
  per_weight = (four - two) / (2 * weights)
  assert 1.9 < per_weight < 2.5, per_weight
