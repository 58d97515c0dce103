"""Sampling's programs on XLA:CPU hold no float32 copy of 16-bit weights beyond the block or layer running (issue
36): the vision tower converts one block at a time, the decode loop converts only the embedding rows it reads.
Compile-time figures (`memory_analysis`, abstract weights: nothing allocated), at tiny widths."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxcap.models import Qwen25VL, row_blocks, tiny
from jaxcap.models.vision import VisionTower, vision_layout
from jaxcap.sampling import generate
from jaxcap.sampling.distribution import SamplingConfig
from jaxcap.sampling.prompts import Prompts


def _tower_temp_bytes(depth: int) -> tuple[int, int]:
  """(temporary bytes of the bf16 tower's compiled forward, unrolled as the sampler runs it; one block's weights
  in float32 bytes)."""
  cfg = dataclasses.replace(
    tiny().vision, depth=depth, hidden_size=128, intermediate_size=512, num_heads=2, fullatt_block_indexes=(depth - 1,)
  )
  graphdef, params = nnx.split(
    nnx.eval_shape(
      lambda: VisionTower(cfg, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, unroll=True, rngs=nnx.Rngs(0))
    )
  )
  grid = np.asarray([[1, 4, 4]])
  layout = vision_layout(grid, cfg)
  pixels = jax.ShapeDtypeStruct((16, cfg.patch_dim), jnp.bfloat16)
  run = jax.jit(lambda p, x, lay: nnx.merge(graphdef, p)(x, lay))
  temp = run.lower(params, pixels, layout).compile().memory_analysis().temp_size_in_bytes
  block = sum(int(np.prod(a.shape[1:])) for a in jax.tree.leaves(nnx.state(params["blocks"])) if a.ndim >= 3)
  return temp, block * 4


def test_bf16_vision_tower_converts_one_block_at_a_time():
  """XLA:CPU computes bf16 dots in float32. Unrolled with each block's weights tied to its input
  (`scan_layers(per_layer_converts=True)`), the tower's temporaries do not grow with depth by the extra blocks'
  float32 weights (they did: all of them converted up front, 2.35 GiB at Qwen2.5-VL-3B's 32 blocks)."""
  (two, block), (eight, _) = _tower_temp_bytes(2), _tower_temp_bytes(8)
  assert eight - two < block, (two, eight, block)  # six more blocks: 6 x `block` when converted up front


def test_tied_weights_keep_their_gradient():
  """`row_blocks.in_step` is the identity in its weights, derivative included (a bit cast alone has none: the
  weight's gradient was silently zero)."""
  w = jax.random.normal(jax.random.key(0), (8, 4), jnp.bfloat16)
  x = jax.random.normal(jax.random.key(1), (3, 8), jnp.bfloat16)
  loss = lambda w, x, tie: jnp.sum((x @ (row_blocks.in_step(w, x) if tie else w)).astype(jnp.float32) ** 2)
  got = jax.grad(loss, argnums=(0, 1))(w, x, True)
  want = jax.grad(loss, argnums=(0, 1))(w, x, False)
  assert float(jnp.abs(want[0]).max()) > 0
  for g, h in zip(got, want):
    np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(h, np.float32))


def _decode_temp_bytes(program, cfg) -> int:
  """Temporary bytes of `program` (a decode jit) compiled for 2 text prompts of 16 tokens, abstract weights."""
  graphdef, params = nnx.split(nnx.eval_shape(lambda: Qwen25VL(cfg, rngs=nnx.Rngs(0))))
  spec = jax.ShapeDtypeStruct
  prompts = Prompts(spec((2, 16), jnp.int32), spec((2, 16), bool), spec((3, 2, 16), jnp.int32), spec((2,), jnp.int32))
  static = generate.static_arguments(graphdef, SamplingConfig(max_new_tokens=4), cfg.eos_token_id, 0)
  prefill = functools.partial(generate.prefill, num_samples=1, **static)
  state = jax.eval_shape(prefill, params, prompts, spec((2,), jnp.uint32))
  return program.lower(params, state, **static).compile().memory_analysis().temp_size_in_bytes


def test_decode_loop_converts_only_the_embedding_rows_it_reads():
  """A bf16 decode loop gathers each step's token embeddings; XLA:CPU's gather converts its table to float32, and
  hoisted out of the loop that is a copy of the whole table for the loop's duration. The sampler's decode program
  (`loop_program.LoopProgram`) holds no such copy; the same program through plain `jax.jit` does."""
  base = tiny(vocab_size=16384)
  cfg = base.replace(
    param_dtype=jnp.bfloat16,
    dtype=jnp.bfloat16,
    text=dataclasses.replace(base.text, hidden_size=256, mrope_section=(8, 12, 12), tie_word_embeddings=True),
  )
  table32 = cfg.text.vocab_size * cfg.text.hidden_size * 4
  hoisting = jax.jit(generate.decode, static_argnames=("graphdef", "sampling", "stop_ids", "pad_id"))
  assert _decode_temp_bytes(hoisting, cfg) >= table32
  assert _decode_temp_bytes(generate.decode_jit, cfg) < table32 // 4
