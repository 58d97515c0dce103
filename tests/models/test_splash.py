"""Splash attention for packed rows (jaxcap.models.splash), run in Pallas interpret mode on CPU: equal to the dense
segment-masked attention (`dense_segment_mask` + `cached_attention`) at every real token on hand-built layouts
(segments across the kernel's 128-slot blocks, a padding tail, GQA), its gradients too, the span's band reaching the
kernel, and the decoder dispatching to it only where it applies."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcap.models import splash
from jaxcap.models.cache_attention import cached_attention
from jaxcap.models.fused_segments import FusedSegments
from jaxcap.models.segment_attention import dense_segment_mask

import segment_rows

N, K, H = 4, 2, 16  # query heads, key/value heads (GQA groups of 2), head dim
T = 300  # slots per row: padded to 384 in the kernel, three blocks of 128
SCALE = H**-0.5
# per row, segment lengths end to end from slot 0, padding after: segments across the block boundaries at 128 and
# 256 (100 + 60 + 90: the 60 spans 100..160, the 90 spans 160..250), one across both (40 + 230), short ones then
# whole blocks of padding, one filling the row
ROWS = [[100, 60, 90], [40, 230, 5], [1, 1, 3, 7], [300]]


def _segments(rows, t=T):
  return segment_rows.segments(rows, t)


def _qkv(b, t=T, seed=0):
  return segment_rows.qkv(b, t, N, K, H, seed)


def _dense(q, k, v, segments):
  """The reference: float32 scores over the whole row under the dense segment mask."""
  keys, values = k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3)
  return cached_attention(q, keys, values, dense_segment_mask(segments), SCALE)


@pytest.fixture
def interpret(monkeypatch):
  monkeypatch.setattr(splash, "INTERPRET", True)


def _splash(q, k, v, segments, span=None):
  return splash.splash_segment_attention(q, k, v, FusedSegments(segments, "tpu", span), SCALE)


@pytest.mark.parametrize("span", [None, 230], ids=["causal", "band"])
def test_splash_equals_dense_on_hand_built_layouts(interpret, span):
  segments = _segments(ROWS[:3])  # the longest segment 230: the band holds every row
  q, k, v = _qkv(3)
  got, want = np.asarray(_splash(q, k, v, segments, span)), np.asarray(_dense(q, k, v, segments))
  real = np.asarray(segments > 0)
  assert got.shape == q.shape
  np.testing.assert_allclose(got[real], want[real], rtol=2e-5, atol=2e-6)
  assert np.all(np.isfinite(got))  # a padding query sees the padding before it: finite, never read


def test_splash_full_row_and_short_row(interpret):
  """A row one segment long (no padding) and one shorter than a block (the kernel pads it to 128)."""
  for rows, t in (([[300]], T), ([[20, 17]], 40)):
    segments = _segments(rows, t)
    q, k, v = _qkv(1, t, seed=1)
    got, want = np.asarray(_splash(q, k, v, segments)), np.asarray(_dense(q, k, v, segments))
    real = np.asarray(segments > 0)
    np.testing.assert_allclose(got[real], want[real], rtol=2e-5, atol=2e-6)


def test_a_short_span_reaches_the_kernel(interpret):
  """A span shorter than a segment drops its earliest keys for its late queries: the band is the kernel's mask."""
  segments = _segments([[200, 50]])
  q, k, v = _qkv(1, seed=2)
  got, want = np.asarray(_splash(q, k, v, segments, span=64)), np.asarray(_dense(q, k, v, segments))
  assert np.max(np.abs(got[0, 150] - want[0, 150])) > 1e-3  # slot 150 needs slots 0..86, outside its band
  np.testing.assert_allclose(got[0, :64], want[0, :64], rtol=2e-5, atol=2e-6)  # within the span of the row start


def test_splash_under_a_mesh(interpret):
  """Under a (data, fsdp, tensor) mesh the kernel runs per shard of rows and heads (shard_map): the same outputs."""
  from jaxcap.sharding import make_mesh

  segments = _segments(ROWS)
  q, k, v = _qkv(4, seed=6)
  with jax.set_mesh(make_mesh({"data": 2, "fsdp": 2, "tensor": 2}, jax.devices()[:8])):
    got = np.asarray(jax.jit(_splash)(q, k, v, segments))
    assert "shard_map" in str(jax.make_jaxpr(_splash)(q, k, v, segments))
  want = np.asarray(_dense(q, k, v, segments))
  real = np.asarray(segments > 0)
  np.testing.assert_allclose(got[real], want[real], rtol=2e-5, atol=2e-6)


def test_splash_gradients_equal_dense(interpret):
  segments = _segments([[100, 60, 90]])
  q, k, v = _qkv(1, seed=3)
  weight = (
    jnp.asarray(np.random.default_rng(4).normal(size=q.shape).astype(np.float32)) * (segments > 0)[..., None, None]
  )
  loss = lambda f: lambda q, k, v: jnp.sum(f(q, k, v, segments) * weight)
  got = jax.grad(loss(_splash), argnums=(0, 1, 2))(q, k, v)
  want = jax.grad(loss(_dense), argnums=(0, 1, 2))(q, k, v)
  for g, w, name in zip(got, want, "qkv"):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=2e-5, err_msg=name)


def test_heads_must_group():
  q, k, v = _qkv(1, t=8)
  with pytest.raises(ValueError, match="not a multiple"):
    _splash(q[:, :, :3], k, v, _segments([[8]], 8))


def test_dispatch_only_where_it_applies(interpret, monkeypatch):
  """The decoder (tiny model) on packed rows: through splash under `INTERPRET` (equal to the jnp path at every real
  token), through the jnp path on CPU otherwise."""
  from flax import nnx

  import jaxcap.models as M

  segments = _segments([[100, 60, 90], [40, 200]], 260)
  positions = jnp.broadcast_to(jnp.cumsum(segments > 0, -1)[None], (3, *segments.shape))
  cfg = M.tiny()
  model = M.Qwen25VL(cfg, rngs=nnx.Rngs(0))
  x = jnp.asarray(np.random.default_rng(5).normal(size=(*segments.shape, cfg.text.hidden_size)), cfg.dtype)
  calls = []
  kernel = splash.splash_segment_attention
  monkeypatch.setattr(splash, "splash_segment_attention", lambda *a: calls.append(1) or kernel(*a))
  decode = lambda: np.asarray(model.decode(x, positions, segments > 0, segments=segments)[0], np.float32)
  got = decode()
  assert calls  # every layer went through the kernel
  monkeypatch.setattr(splash, "INTERPRET", False)
  assert not splash.applies()  # CPU: the jnp path
  calls.clear()
  want = decode()
  assert not calls
  real = np.asarray(segments > 0)
  np.testing.assert_allclose(got[real], want[real], rtol=1e-5, atol=1e-5)


def test_compiles_for_a_tpu_topology():
  """Where the TPU compiler is importable (libtpu, no chip needed), a mesh of TPU devices picks the
  kernel (no `INTERPRET`) and it compiles to a Mosaic custom call, forward and backward."""
  pytest.importorskip("libtpu")
  from jaxcap.plan.topology import topology_devices
  from jaxcap.sharding import make_mesh

  devices, _ = topology_devices("tpu:v5e:1x1")
  segments = jax.ShapeDtypeStruct((2, 256), jnp.int32)
  q = jax.ShapeDtypeStruct((2, 256, 4, 128), jnp.bfloat16)
  k = jax.ShapeDtypeStruct((2, 256, 2, 128), jnp.bfloat16)
  loss = lambda q, k, v, segments: jnp.sum(_splash(q, k, v, segments).astype(jnp.float32))
  # not into the persistent cache: a TPU executable cannot be read back on a CPU host (a warning, then a recompile)
  cached = jax.config.jax_persistent_cache_min_compile_time_secs
  jax.config.update("jax_persistent_cache_min_compile_time_secs", float("inf"))
  try:
    with jax.set_mesh(make_mesh(None, devices)):
      assert splash.applies()
      hlo = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, k, k, segments).compile().as_text()
  finally:
    jax.config.update("jax_persistent_cache_min_compile_time_secs", cached)
  assert hlo.count("tpu_custom_call") == 3  # the forward, dq and dkv kernels
