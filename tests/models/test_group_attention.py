"""The prompt-shared attention of a group's completions (jaxcap.models.group_attention): the jnp path equals the
repeated rows' dense causal attention at every completion position; splash's (Pallas interpret mode on CPU) equals
the jnp path, values and gradients, with prompt padding, GQA, completions across the kernel's 128-slot blocks; and it
compiles for a TPU topology where libtpu is importable."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcap.models import splash
from jaxcap.models.group_attention import group_attention

B, P, C, G = 2, 50, 70, 3  # G x C = 210 queries a prompt (two 128 blocks), keys 260 (three)
NH, K, H = 4, 2, 16
SCALE = H**-0.5


def _inputs(seed=0):
  rng = np.random.default_rng(seed)
  f = lambda *s: jnp.asarray(rng.normal(size=s).astype(np.float32))
  real = np.ones((B, P), bool)
  real[1, :17] = False  # left padding
  return f(B * G, C, NH, H), f(B * G, C, K, H), f(B * G, C, K, H), f(B, P, K, H), f(B, P, K, H), jnp.asarray(real)


def test_jnp_path_equals_the_repeated_rows():
  q, k, v, pk, pv, real = _inputs()
  got = np.asarray(group_attention(q, k, v, pk, pv, real, SCALE))
  # the repeated rows [prompt | completion] with the dense causal mask over real keys
  rows_k = jnp.concatenate([jnp.repeat(pk, G, 0), k], 1)
  rows_v = jnp.concatenate([jnp.repeat(pv, G, 0), v], 1)
  rows_q = jnp.concatenate([jnp.zeros((B * G, P, NH, H)), q], 1)
  keys_real = jnp.concatenate([jnp.repeat(real, G, 0), jnp.ones((B * G, C), bool)], 1)
  mask = jnp.tril(jnp.ones((P + C, P + C), bool))[None, None] & keys_real[:, None, None, :]
  want = jax.nn.dot_product_attention(rows_q, rows_k, rows_v, mask=mask, scale=SCALE)[:, P:]
  np.testing.assert_allclose(got, np.asarray(want), rtol=2e-5, atol=2e-6)


def test_splash_equals_the_jnp_path_values_and_gradients(monkeypatch):
  args = _inputs(1)
  w = jnp.asarray(np.random.default_rng(2).normal(size=(B * G, C, NH, H)).astype(np.float32))
  loss = lambda *a: jnp.sum(group_attention(*a, args[-1], SCALE) * w)
  want = jax.value_and_grad(loss, argnums=range(5))(*args[:5])
  monkeypatch.setattr(splash, "INTERPRET", True)
  calls = []
  kernel = splash.group_attention
  monkeypatch.setattr(splash, "group_attention", lambda *a: calls.append(1) or kernel(*a))
  got = jax.value_and_grad(loss, argnums=range(5))(*args[:5])
  assert calls
  np.testing.assert_allclose(float(got[0]), float(want[0]), rtol=1e-5)
  for name, a, b in zip(("q", "k", "v", "prompt_k", "prompt_v"), got[1], want[1]):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-5, err_msg=name)


def test_group_mask_hand_case():
  """P 2, G 2, C 2, padded to 8 x 8: rows 0-1 completion 0, rows 2-3 completion 1, rows 4-7 padding."""
  got = splash.group_mask(2, 2, 2, 8, 8).astype(int)
  want = np.array(
    [
      [1, 1, 1, 0, 0, 0, 0, 0],
      [1, 1, 1, 1, 0, 0, 0, 0],
      [1, 1, 0, 0, 1, 0, 0, 0],
      [1, 1, 0, 0, 1, 1, 0, 0],
    ]
    + [[1] * 8] * 4
  )
  np.testing.assert_array_equal(got, want)


def test_compiles_for_a_tpu_topology():
  pytest.importorskip("libtpu")
  from jaxcap.plan.topology import topology_devices
  from jaxcap.sharding import make_mesh

  devices, _ = topology_devices("tpu:v5e:1x1")
  s = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.bfloat16)
  args = (s(8, 128, 4, 128), s(8, 128, 2, 128), s(8, 128, 2, 128), s(2, 256, 2, 128), s(2, 256, 2, 128))
  real = jax.ShapeDtypeStruct((2, 256), jnp.bool_)
  loss = lambda *a: jnp.sum(group_attention(*a, SCALE).astype(jnp.float32))
  cached = jax.config.jax_persistent_cache_min_compile_time_secs
  jax.config.update("jax_persistent_cache_min_compile_time_secs", float("inf"))
  try:
    with jax.set_mesh(make_mesh(None, devices)):
      assert splash.applies()
      hlo = jax.jit(jax.grad(loss, argnums=range(5))).lower(*args, real).compile().as_text()
  finally:
    jax.config.update("jax_persistent_cache_min_compile_time_secs", cached)
  assert hlo.count("tpu_custom_call") == 3  # the forward, dq and dkv kernels
