"""The decode cache's shared prompt prefix (`KVCache.grow`): the G samples of a prompt read one copy of its keys and
values, and attention over (prefix, own slots) equals attention over a cache that repeats the prompt per row."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcap.models import KVCache, tiny
from jaxcap.models.qwen25vl import cached_attention


def _rand(rng, *shape, dtype=jnp.float32):
  return jnp.asarray(rng.standard_normal(shape), dtype)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("t", [1, 3])
def test_prefix_attention_equals_attention_over_repeated_prompt(dtype, t):
  rng = np.random.default_rng(0)
  prompts, reps, kv_heads, g, h, s0, s = 3, 4, 2, 3, 16, 7, 5
  rows = prompts * reps
  q = _rand(rng, rows, t, kv_heads * g, h, dtype=dtype)
  pk, pv = _rand(rng, prompts, kv_heads, h, s0, dtype=dtype), _rand(rng, prompts, kv_heads, s0, h, dtype=dtype)
  k, v = _rand(rng, rows, kv_heads, h, s, dtype=dtype), _rand(rng, rows, kv_heads, s, h, dtype=dtype)
  # left padding differs per prompt; each row's own slots are filled to a different depth
  mask = rng.random((rows, 1, t, s0 + s)) < 0.7
  mask[:, :, :, s0 - 1] = True  # every row sees at least one slot
  mask = jnp.asarray(mask)
  shared = cached_attention(q, k, v, mask, 0.25, prefix=(pk, pv))
  full_k = jnp.concatenate([jnp.repeat(pk, reps, axis=0), k], axis=3)
  full_v = jnp.concatenate([jnp.repeat(pv, reps, axis=0), v], axis=2)
  repeated = cached_attention(q, full_k, full_v, mask, 0.25)
  assert shared.shape == repeated.shape == q.shape and shared.dtype == q.dtype
  tol = 1e-5 if dtype == jnp.float32 else 2e-2
  np.testing.assert_allclose(np.asarray(shared, np.float32), np.asarray(repeated, np.float32), atol=tol, rtol=tol)


def test_grow_keeps_one_copy_of_the_prompt():
  cfg = tiny()
  t = cfg.text
  prompt = KVCache.zeros(cfg, batch=2, slots=6)
  prompt = KVCache(tuple(a + i for i, a in enumerate(prompt.k)), prompt.v)
  grown = prompt.grow(4, 5)
  assert grown.prefix_slots == 6 and grown.slots == 11
  assert all(a.shape == (2, t.num_key_value_heads, t.head_dim, 6) for a in grown.prefix_k)  # not repeated
  assert all(a.shape == (8, t.num_key_value_heads, t.head_dim, 5) for a in grown.k)
  assert all(a.shape == (8, t.num_key_value_heads, 5, t.head_dim) for a in grown.v)
  assert all(float(jnp.max(a)) == i for i, a in enumerate(grown.prefix_k))  # the prompt's own buffers
  with pytest.raises(ValueError, match="already has a shared prefix"):
    grown.grow(2, 1)


def test_decode_writes_own_slots_after_the_prefix():
  """One cached step through the model writes the new token's keys at own slot (cache_index - prefix slots) and
  leaves the shared prefix untouched."""
  from flax import nnx

  from jaxcap.models import Qwen25VL

  cfg = tiny()
  model = Qwen25VL(cfg, rngs=nnx.Rngs(0))
  rng = np.random.default_rng(1)
  prompt = KVCache.zeros(cfg, batch=2, slots=4)
  prompt = KVCache(tuple(_rand(rng, *a.shape) for a in prompt.k), tuple(_rand(rng, *a.shape) for a in prompt.v))
  cache = prompt.grow(3, 4)
  x = _rand(rng, 6, 1, cfg.text.hidden_size)
  positions = jnp.full((3, 6, 1), 5, jnp.int32)
  slot_mask = jnp.ones((6, 8), bool)
  _, out = jax.jit(model.decode)(x, positions, slot_mask, cache, 4 + 2)
  for before, after in zip(cache.prefix_k, out.prefix_k):
    np.testing.assert_array_equal(np.asarray(before), np.asarray(after))
  for k in out.k:
    written = np.abs(np.asarray(k)).sum(axis=(0, 1, 2))  # per own slot
    assert written[2] > 0 and np.all(written[[0, 1, 3]] == 0)
