"""Blocked attention within packed rows' segments (jaxcap.models.segment_attention): equal to the dense
segment-masked attention on hand-built layouts (outputs and gradients), reading no key outside its window, and the
window's ladder."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcap.models.segment_attention import (
  SegmentWindow,
  dense_segment_mask,
  segment_attention,
  segment_mask,
  segment_window,
)

import segment_rows

N, K, H = 4, 2, 8  # query heads, key/value heads (GQA groups of 2), head dim
T = 22  # slots per row: 6 blocks of 4, the last one half past the row
WINDOW = SegmentWindow(block=4, blocks=3)  # span 9: a query reads 8 slots back
# per row, segment lengths end to end from slot 0, padding after: segments crossing block boundaries (3 + 9 + 5:
# the 9 starts mid-block and spans three), two of the window's span end to end, short ones then whole blocks of
# padding, one alone
ROWS = [[3, 9, 5], [9, 9, 2], [1, 1, 1, 7], [6]]


def _segments(rows, t=T):
  return segment_rows.segments(rows, t)


def _qkv(b, t=T, seed=0):
  return segment_rows.qkv(b, t, N, K, H, seed)


def _dense(q, k, v, segments):
  return jax.nn.dot_product_attention(q, k, v, mask=dense_segment_mask(segments), scale=H**-0.5)


def _blocked(q, k, v, segments, window=WINDOW):
  return segment_attention(q, k, v, segment_mask(segments, window), H**-0.5)


def test_blocked_equals_dense_on_hand_built_layouts():
  segments = _segments(ROWS)
  assert max(map(max, ROWS)) == WINDOW.span
  q, k, v = _qkv(len(ROWS))
  got, want = _blocked(q, k, v, segments), _dense(q, k, v, segments)
  real = np.asarray(segments > 0)
  # to float rounding: bitwise on some CPUs, 4.8e-7 apart on others (XLA:CPU's reductions group the same nonzero
  # weights by the host's vector width); a key read across a segment would be off by ~0.1
  np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], rtol=1e-6, atol=2e-6)
  assert np.all(np.isfinite(np.asarray(got)))  # padding queries read no key: finite, never read


def test_blocked_gradients_equal_dense():
  segments = _segments(ROWS)
  q, k, v = _qkv(len(ROWS), seed=1)
  weight = (
    jnp.asarray(np.random.default_rng(2).normal(size=q.shape).astype(np.float32)) * (segments > 0)[..., None, None]
  )
  loss = lambda f: lambda q, k, v: jnp.sum(f(q, k, v, segments) * weight)
  got = jax.grad(loss(_blocked), argnums=(0, 1, 2))(q, k, v)
  want = jax.grad(loss(_dense), argnums=(0, 1, 2))(q, k, v)
  for g, w, name in zip(got, want, "qkv"):  # within 5e-7: the backward's sums group the terms apart
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6, err_msg=name)


def test_blocked_reads_only_its_window():
  """A window shorter than a segment drops that segment's earliest keys for its late queries: the blocked attention
  does not read the whole row."""
  segments = _segments([[9, 9, 2]])
  q, k, v = _qkv(1, seed=3)
  short = SegmentWindow(block=4, blocks=2)  # span 5
  got, want = np.asarray(_blocked(q, k, v, segments, short)), np.asarray(_dense(q, k, v, segments))
  # slot 8 (the first segment's last token) needs slot 0, outside its window [4, 12)
  assert np.max(np.abs(got[0, 8] - want[0, 8])) > 1e-3
  np.testing.assert_allclose(got[0, :5], want[0, :5], rtol=1e-6, atol=1e-6)  # within 5 of the row start: whole


@pytest.mark.parametrize("t, lengths", [(22, [5, 5, 5, 5]), (24, [5, 4, 5, 5, 5]), (5, [2, 3]), (3, [3])])
def test_row_lengths_off_the_block(t, lengths):
  """Rows not a whole number of blocks (the blocked side pads them) and rows shorter than one block."""
  segments = _segments([lengths], t)
  q, k, v = _qkv(1, t, seed=4)
  window = SegmentWindow(block=4, blocks=2)  # span 5
  got, want = _blocked(q, k, v, segments, window), _dense(q, k, v, segments)
  real = np.asarray(segments > 0)
  assert got.shape == q.shape
  np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], rtol=1e-6, atol=1e-6)


def test_window_ladder():
  w = segment_window(261, 512)
  assert (w.block, w.blocks, w.span) == (32, 10, 289)
  assert segment_window(289, 512) == w and segment_window(258, 512) == w  # one window (program) for a range
  assert segment_window(290, 512).blocks == 12  # 11 blocks, up the ladder (4 sizes per octave)
  assert segment_window(300, 320) is None  # the window would cover the row: dense
  assert segment_window(9, T, block=4) == WINDOW
  for longest in range(1, 600, 7):
    w = segment_window(longest, 4096)
    assert w.span >= longest and segment_window(w.span, 4096) == w


@pytest.mark.parametrize("dtype, tol", [(jnp.float32, 1e-6), (jnp.bfloat16, 1e-2)])
def test_decoder_with_a_window_equals_dense(dtype, tol):
  """The decoder (tiny model, every layer) on packed rows: `segment_window` changes no real token's hidden state, in
  float32 and in bfloat16 compute (the blocks' bf16 x bf16 -> f32 scores as the dense path's)."""
  from flax import nnx

  import jaxcap.models as M

  segments = _segments(ROWS)
  positions = jnp.broadcast_to(jnp.cumsum(segments > 0, -1)[None], (3, *segments.shape))
  cfg = M.tiny(dtype=dtype)
  model = M.Qwen25VL(cfg, rngs=nnx.Rngs(0))
  x = jnp.asarray(np.random.default_rng(5).normal(size=(*segments.shape, cfg.text.hidden_size)), dtype)
  decode = lambda w: model.decode(x, positions, segments > 0, segments=segments, segment_window=w)[0]
  got, want = np.asarray(decode(WINDOW), np.float32), np.asarray(decode(None), np.float32)
  real = np.asarray(segments > 0)
  np.testing.assert_allclose(got[real], want[real], rtol=tol, atol=tol)
  short = np.asarray(decode(SegmentWindow(block=4, blocks=2)), np.float32)  # span 5 < the 9-token segments
  # the window reaches the layers: a short one moves real tokens by more than the tolerance the right one meets
  assert np.max(np.abs(short[real] - want[real])) > max(tol, 10 * np.max(np.abs(got[real] - want[real])))
