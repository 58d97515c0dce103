"""`unrolled_on_cpu`: a 16-bit model's forward on XLA:CPU without a float32 copy of its layer stacks."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jaxcap.models as M
from jaxcap.models.inference_graph import unrolled_on_cpu


def _model():
  """Weights dominate the program's memory: wide layers, a short prompt."""
  cfg = M.tiny().replace(dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
  text = dataclasses.replace(cfg.text, intermediate_size=2048, num_hidden_layers=4)
  return M.Qwen25VL(cfg.replace(text=text), rngs=nnx.Rngs(0))


def test_unrolled_graph_holds_no_float32_copy_of_the_decoder_stack_and_computes_the_same():
  graphdef, params = nnx.split(_model())
  unrolled = unrolled_on_cpu(graphdef, params)
  assert unrolled != graphdef and unrolled_on_cpu(unrolled, params) == unrolled  # idempotent
  ids = jnp.arange(32, dtype=jnp.int32).reshape(2, 16)
  args = (ids, jnp.broadcast_to(jnp.arange(16), (3, 2, 16)), jnp.ones((2, 16), bool), None)
  forward = lambda g: jax.jit(lambda p, *a: nnx.merge(g, p)(*a)[0])
  temp = {
    g: forward(g).lower(params, *args).compile().memory_analysis().temp_size_in_bytes for g in (graphdef, unrolled)
  }
  stack = sum(x.size for x in jax.tree.leaves(nnx.to_pure_dict(params)["layers"]))
  # the scan's loop state held the whole stack converted to float32; unrolled, one layer's convert at a time
  assert temp[graphdef] - temp[unrolled] >= 0.75 * stack * 4, (temp, stack * 4)
  scanned, flat = np.asarray(forward(graphdef)(params, *args)), np.asarray(forward(unrolled)(params, *args))
  assert np.abs(scanned - flat).max() <= 0.02 * np.abs(scanned).max()  # bf16 rounding in a different order
  assert (scanned.argmax(-1) == flat.argmax(-1)).mean() >= 0.9
