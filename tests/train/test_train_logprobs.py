"""Chunked log-probs equal the direct computation, values and gradients."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jaxcap.models as M
from jaxcap.train.steps.logprobs import token_logprobs


def test_chunked_token_logprobs_equal_direct_values_and_grads():
  model = M.Qwen25VL(M.tiny(), rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model)
  rng = np.random.default_rng(0)
  hidden = jnp.asarray(rng.normal(size=(3, 37, 64)).astype(np.float32))
  tokens = jnp.asarray(rng.integers(0, 512, (3, 37)).astype(np.int32))

  def f(params, chunk):
    lp, ent = token_logprobs(nnx.merge(graphdef, params), hidden, tokens, with_entropy=True, chunk=chunk)
    return jnp.sum(lp * jnp.arange(37)) + jnp.sum(ent), (lp, ent)

  (v1, (lp1, e1)), g1 = jax.jit(jax.value_and_grad(lambda p: f(p, None), has_aux=True))(params)
  (v2, (lp2, e2)), g2 = jax.jit(jax.value_and_grad(lambda p: f(p, 8), has_aux=True))(params)  # 37 = 4x8 + 5
  np.testing.assert_allclose(lp2, lp1, atol=1e-5)
  np.testing.assert_allclose(e2, e1, atol=1e-5)
  assert jax.tree.structure(g2) == jax.tree.structure(g1)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4), g2, g1)
  assert any(np.abs(np.asarray(x)).sum() > 0 for x in jax.tree.leaves(g1))
