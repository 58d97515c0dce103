"""Pallas flash attention for packed rows on GPU (jaxcap.models.gpu_flash), run in Pallas interpret mode on CPU: equal
to the dense segment-masked attention (`dense_segment_mask` + `cached_attention`) at every real token on hand-built
layouts (segments across the kernel's 128-slot blocks, a padding tail, GQA, rows shorter than a block), its
gradients too, under a mesh, lowered for GPU on this host (Triton), and the decoders (Qwen2.5-VL, Qwen3-VL) dispatching to it only where it applies
(`packed_attention`, the one decision point)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcap.models import gpu_flash, splash
from jaxcap.models.cache_attention import cached_attention
from jaxcap.models.fused_segments import FusedSegments
from jaxcap.models.packed_attention import packed_mask
from jaxcap.models.segment_attention import SegmentMask, SegmentWindow, dense_segment_mask

import segment_rows
from abstract_gpu import abstract_gpu

N, K, H = 4, 2, 16  # query heads, key/value heads (GQA groups of 2), head dim
T = 300  # slots per row: padded to 384 in the kernel, three blocks of 128
SCALE = H**-0.5
# per row, segment lengths end to end from slot 0, padding after: segments across the block boundaries at 128 and
# 256, one across both (40 + 230), short ones then whole blocks of padding, one filling the row
ROWS = [[100, 60, 90], [40, 230, 5], [1, 1, 3, 7], [300]]
TOL = dict(rtol=2e-5, atol=2e-6)


def _qkv(b, t=T, seed=0):
  return segment_rows.qkv(b, t, N, K, H, seed)


def _dense(q, k, v, segments):
  """The reference: float32 scores over the whole row under the dense segment mask."""
  keys, values = k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3)
  return cached_attention(q, keys, values, dense_segment_mask(segments), SCALE)


def _flash(q, k, v, segments):
  return gpu_flash.flash_segment_attention(q, k, v, FusedSegments(segments, "gpu"), SCALE)


@pytest.fixture
def interpret(monkeypatch):
  monkeypatch.setattr(gpu_flash, "INTERPRET", True)


def _check(got, want, segments, tol=TOL):
  real = np.asarray(segments > 0)
  assert got.shape == want.shape
  np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], **tol)
  assert np.all(np.isfinite(np.asarray(got)))  # a padding query sees the padding before it: finite, never read


def test_slots_fit_the_kernels_blocks():
  assert [gpu_flash.slots(t) for t in (1, 16, 17, 40, 128, 129, 300)] == [16, 16, 32, 64, 128, 256, 384]


@pytest.mark.parametrize("dtype, tol", [(jnp.float32, TOL), (jnp.bfloat16, dict(rtol=2e-2, atol=2e-2))])
def test_flash_equals_dense_on_hand_built_layouts(interpret, dtype, tol):
  """In float32 and in bfloat16 (the kernel's bf16 x bf16 -> f32 scores, its probabilities cast to bf16 for p . v;
  the reference's in float32)."""
  segments = segment_rows.segments(ROWS, T)
  q, k, v = (x.astype(dtype) for x in _qkv(4))
  _check(_flash(q, k, v, segments).astype(jnp.float32), _dense(q, k, v, segments).astype(jnp.float32), segments, tol)


def test_short_row(interpret):
  """A row shorter than a block: padded to the next power of two (40 -> 64 slots, one block)."""
  segments = segment_rows.segments([[20, 17]], 40)
  q, k, v = _qkv(1, 40, seed=1)
  _check(_flash(q, k, v, segments), _dense(q, k, v, segments), segments)


def test_flash_gradients_equal_dense(interpret):
  t = 160  # two forward blocks, eight backward ones
  segments = segment_rows.segments([[100, 40, 10]], t)
  q, k, v = _qkv(1, t, seed=3)
  weight = jnp.asarray(np.random.default_rng(4).normal(size=q.shape).astype(np.float32))
  weight = weight * (segments > 0)[..., None, None]  # the loss reads real tokens only
  loss = lambda f: lambda q, k, v: jnp.sum(f(q, k, v, segments) * weight)
  got = jax.grad(loss(_flash), argnums=(0, 1, 2))(q, k, v)
  want = jax.grad(loss(_dense), argnums=(0, 1, 2))(q, k, v)
  for g, w, name in zip(got, want, "qkv"):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=2e-5, err_msg=name)


def test_flash_under_a_mesh(interpret):
  """Under a (data, fsdp, tensor) mesh the kernel runs per shard of rows and heads (shard_map): the same outputs."""
  from jaxcap.sharding import make_mesh

  segments = segment_rows.segments(ROWS, T)
  q, k, v = _qkv(4, seed=6)
  with jax.set_mesh(make_mesh({"data": 2, "fsdp": 2, "tensor": 2}, jax.devices()[:8])):
    got = jax.jit(_flash)(q, k, v, segments)
    assert "shard_map" in str(jax.make_jaxpr(_flash)(q, k, v, segments))
  _check(got, _dense(q, k, v, segments), segments)


def test_heads_must_group():
  q, k, v = _qkv(1, t=8)
  with pytest.raises(ValueError, match="not a multiple"):
    _flash(q[:, :, :3], k, v, segment_rows.segments([[8]], 8))


def test_lowers_to_triton_for_gpu():
  """A program targeting GPU (no `INTERPRET`) lowers, on this CPU host, to the Pallas Triton kernels, forward and
  backward: the kernel's constraints (power-of-two tiles: a long row, a short one; a head dim rounded up) hold.
  The target is an abstract GPU (`abstract_gpu`: jax 0.11 needs one to lower Triton without a GPU), which is also
  what makes the kernel apply (`target_platform`: the ambient mesh's device)."""
  loss = lambda q, k, v, segments: jnp.sum(_flash(q, k, v, segments).astype(jnp.float32))
  for t, h in ((300, 128), (40, 24)):
    q, k = (jax.ShapeDtypeStruct((2, t, heads, h), jnp.bfloat16) for heads in (8, 2))
    segments = jax.ShapeDtypeStruct((2, t), jnp.int32)
    with abstract_gpu():
      assert gpu_flash.applies()
      traced = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(q, k, k, segments)
      lowered = traced.lower(lowering_platforms=("cuda",))
    assert lowered.as_text().count("__gpu$xla.gpu.triton") == 3  # forward, backward's preprocessing, backward


def test_the_abstract_gpu_is_the_target_on_either_jax():
  """Under `abstract_gpu` the programs target GPU (jaxcap's kernels read the ambient mesh's device); where jax's
  Triton lowering reads the GPU from the abstract device (0.11 on), it finds a Hopper (compute capability 9.0,
  what 0.10 falls back to without one)."""
  from jaxcap.models.fused_segments import target_platform

  assert target_platform() == jax.default_backend() == "cpu"
  with abstract_gpu():
    assert target_platform() == "gpu"
    triton = pytest.importorskip("jax.experimental.pallas.triton")
    if hasattr(triton, "get_gpu_info"):  # jax >= 0.11
      assert triton.get_gpu_info().compute_capability == 90


def test_one_decision_point(interpret, monkeypatch):
  """`packed_mask`: splash where it applies (TPU first), else this kernel (the window's span carried, unread), else
  a window's blocked mask, else None (dense)."""
  segments = segment_rows.segments([[5, 3]], 8)
  real, window = segments > 0, SegmentWindow(block=4, blocks=2)
  mask = packed_mask(segments, real, window)
  assert isinstance(mask, FusedSegments) and (mask.platform, mask.span) == ("gpu", window.span)
  monkeypatch.setattr(splash, "INTERPRET", True)
  assert packed_mask(segments, real, None).platform == "tpu"
  monkeypatch.setattr(splash, "INTERPRET", False)
  monkeypatch.setattr(gpu_flash, "INTERPRET", False)
  assert isinstance(packed_mask(segments, real, window), SegmentMask)
  assert packed_mask(segments, real, None) is None


@pytest.mark.parametrize("family", ["qwen25vl", "qwen3vl"])
def test_decoder_dispatch(interpret, monkeypatch, family):
  """The decoder (tiny models: Qwen2.5-VL's head dim 16, Qwen3-VL's 24, which the kernel rounds up to 32) on packed
  rows with a segment window: through this kernel under `INTERPRET`, equal at every real token to the jnp path
  (`segment_attention`, the window's blocks) it takes on CPU otherwise."""
  from flax import nnx

  import jaxcap.models as M

  segments = segment_rows.segments([[100, 60, 20], [40, 110]], 180)
  positions = jnp.broadcast_to(jnp.cumsum(segments > 0, -1)[None], (3, *segments.shape))
  cfg = M.tiny() if family == "qwen25vl" else M.qwen3vl_tiny()
  model = (M.Qwen25VL if family == "qwen25vl" else M.Qwen3VL)(cfg, rngs=nnx.Rngs(0))
  x = jnp.asarray(np.random.default_rng(5).normal(size=(*segments.shape, cfg.text.hidden_size)), cfg.dtype)
  calls = []
  kernel = gpu_flash.flash_segment_attention
  monkeypatch.setattr(gpu_flash, "flash_segment_attention", lambda *a: calls.append(1) or kernel(*a))
  window = SegmentWindow(block=32, blocks=5)  # span 129 >= the longest segment (110)
  decode = lambda: np.asarray(model.decode(x, positions, segments > 0, segments=segments, segment_window=window)[0])
  got = decode()
  assert calls  # the layers (a scan: traced once) went through the kernel
  monkeypatch.setattr(gpu_flash, "INTERPRET", False)
  assert not gpu_flash.applies()  # CPU: the jnp path
  calls.clear()
  want = decode()
  assert not calls
  real = np.asarray(segments > 0)
  np.testing.assert_allclose(got[real], want[real], rtol=1e-5, atol=1e-5)
