"""The Gated DeltaNet core (jaxcap.models.gated_delta) against transformers' Qwen3.5 reference functions (torch, CPU),
the chunked rule against the recurrent one (outputs, states, gradients), packed rows against each segment alone,
continuations, the causal conv and the gated RMSNorm."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers.models.mamba.modeling_mamba import causal_conv1d_fn, causal_conv1d_update
from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

from jaxcap.models.gated_delta import (
  causal_conv1d,
  chunk_gated_delta,
  gated_rms_norm,
  recurrent_gated_delta,
)

import segment_rows

HK, DK, DV = 2, 16, 8  # key heads, key dim, value dim (value heads per test: HK or 2 HK)


def _rule_inputs(b, t, hv=2 * HK, seed=0, state=False):
  """float32 numpy q, k [b, t, HK, DK], v [b, t, hv, DV], g, beta [b, t, hv] drawn as Qwen3.5 makes them (g =
  -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b)), and a state [b, hv, DK, DV] (or None)."""
  rng = np.random.default_rng(seed)
  normal = lambda *shape: rng.normal(size=shape).astype(np.float32)
  g = -np.exp(normal(hv) - 1.0) * np.log1p(np.exp(normal(b, t, hv)))  # mostly -0.05 .. -2
  beta = 1 / (1 + np.exp(-normal(b, t, hv)))
  s0 = normal(b, hv, DK, DV) if state else None
  return normal(b, t, HK, DK), normal(b, t, HK, DK), normal(b, t, hv, DV), g.astype(np.float32), beta, s0


_chunk = jax.jit(chunk_gated_delta, static_argnames="chunk_size")
_recurrent = jax.jit(recurrent_gated_delta)


def _torch(fn, q, k, v, g, beta, s0, **kw):
  """A transformers reference rule (falls back to its torch implementation without flash-linear-attention)."""
  t = lambda x: None if x is None else torch.from_numpy(x)
  out, state = fn(t(q), t(k), t(v), t(g), t(beta), initial_state=t(s0), output_final_state=True,
                  use_qk_l2norm_in_kernel=True, **kw)  # fmt: skip
  return out.numpy(), state.numpy()


def _close(got, want, tol=1e-5):
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=tol, atol=tol)


@pytest.mark.parametrize("hv", [HK, 2 * HK])
@pytest.mark.parametrize("state", [False, True])
def test_chunk_equals_transformers(hv, state):
  """T = 45 in chunks of 16 (the last one padded), value heads grouped or not, from zeros or a given state: the
  outputs and final states of torch_chunk_gated_delta_rule (measured: within 3e-7)."""
  args = _rule_inputs(2, 45, hv, seed=1, state=state)
  out, final = _chunk(*args[:5], initial_state=args[5], chunk_size=16)
  want_out, want_final = _torch(hf.torch_chunk_gated_delta_rule, *args, chunk_size=16)
  assert out.shape == want_out.shape and final.dtype == jnp.float32
  _close(out, want_out)
  _close(final, want_final)


def test_recurrent_equals_transformers():
  args = _rule_inputs(2, 20, seed=2, state=True)
  out, final = _recurrent(*args[:5], initial_state=args[5])
  want_out, want_final = _torch(hf.torch_recurrent_gated_delta_rule, *args)
  _close(out, want_out)
  _close(final, want_final)


@pytest.mark.parametrize("chunk_size", [4, 16, 64])
def test_chunk_equals_recurrent(chunk_size):
  """Chunks of 4 (13 of them, the last padded), 16, and 64 (one chunk longer than the sequence: C = T)."""
  args = _rule_inputs(2, 50, seed=3, state=True)
  out, final = _chunk(*args[:5], initial_state=args[5], chunk_size=chunk_size)
  want_out, want_final = _recurrent(*args[:5], initial_state=args[5])
  _close(out, want_out)
  _close(final, want_final)


def test_inert_tokens_leave_the_state():
  """Tokens with g = 0 and beta = 0 (what the chunked form pads with; also right padding kept in the last
  segment) change no state whatever their q, k, v: the real tokens' outputs and the final state are those without
  them."""
  q, k, v, g, beta, s0 = _rule_inputs(1, 19, seed=4, state=True)
  extra = _rule_inputs(1, 5, seed=5)
  padded = [np.concatenate([x, y], axis=1) for x, y in zip((q, k, v), extra[:3])]
  inert = [np.concatenate([x, np.zeros_like(y)], axis=1) for x, y in zip((g, beta), extra[3:5])]
  out, final = _chunk(*padded, *inert, initial_state=s0, chunk_size=8)
  want_out, want_final = _chunk(q, k, v, g, beta, initial_state=s0, chunk_size=8)
  _close(out[:, :19], want_out)
  _close(final, want_final)


# one packed row per layout, chunks of 8: 13 tokens crossing the first chunk boundary, 3 (shorter than a chunk)
# ending on the second, 11 starting exactly on it, then 3 of padding (id 0); and 8 + 2 + 20 with no padding (its
# second segment starts on a boundary, the third mid-chunk and runs over two more)
ROWS = [[13, 3, 11], [8, 2, 20]]
T_ROW = 30


def _segment_slices(lengths):
  ends = np.cumsum(lengths + [T_ROW - sum(lengths)] * (sum(lengths) < T_ROW))
  return [slice(a, b) for a, b in zip(ends - np.diff(ends, prepend=0), ends)]


@pytest.mark.parametrize("state", [False, True])
def test_packed_segments_equal_each_alone(state):
  """Every segment's outputs (padding's included) are those of the segment run alone, from zeros; with an initial
  state the row's first segment reads it. The final state is the row's last segment's."""
  segments = segment_rows.segments(ROWS, T_ROW)
  args = _rule_inputs(len(ROWS), T_ROW, seed=6, state=True)
  s0 = args[5] if state else None
  out, final = _chunk(*args[:5], initial_state=s0, segments=segments, chunk_size=8)
  for row, lengths in enumerate(ROWS):
    pieces = _segment_slices(lengths)
    for i, piece in enumerate(pieces):
      alone = [x[row : row + 1, piece] for x in args[:5]]
      start = s0[row : row + 1] if state and i == 0 else None
      want_out, want_final = _recurrent(*alone, initial_state=start)
      _close(out[row : row + 1, piece], want_out)
    _close(final[row : row + 1], want_final)  # of the last piece


def test_packed_segments_do_not_leak():
  """A segment's outputs do not move when an earlier segment of its row changes (the reset is exact, not a decay)."""
  segments = segment_rows.segments(ROWS, T_ROW)
  q, k, v, g, beta, _ = _rule_inputs(len(ROWS), T_ROW, seed=7)
  out, _ = _chunk(q, k, v, g, beta, segments=segments, chunk_size=8)
  v2 = v.copy()
  v2[:, :8] += 10.0  # the first segment of both rows
  out2, _ = _chunk(q, k, v2, g, beta, segments=segments, chunk_size=8)
  assert np.max(np.abs(out2[0, :13] - out[0, :13])) > 1.0  # the change reaches the segment itself
  np.testing.assert_array_equal(np.asarray(out2[0, 13:]), np.asarray(out[0, 13:]))
  np.testing.assert_array_equal(np.asarray(out2[1, 8:]), np.asarray(out[1, 8:]))


def test_continuation():
  """A prefill in two calls (the second from the first's final state) equals one call; decode steps (T = 1,
  recurrent) after a chunked prefill equal the chunked rule over the whole."""
  args = _rule_inputs(2, 44, seed=8, state=True)
  whole_out, whole_final = _chunk(*args[:5], initial_state=args[5], chunk_size=8)
  first = [x[:, :21] for x in args[:5]]
  out1, s1 = _chunk(*first, initial_state=args[5], chunk_size=8)
  out2, s2 = _chunk(*[x[:, 21:40] for x in args[:5]], initial_state=s1, chunk_size=8)
  _close(jnp.concatenate([out1, out2], axis=1), whole_out[:, :40])
  state, outs = s2, []
  for i in range(40, 44):
    out, state = _recurrent(*[x[:, i : i + 1] for x in args[:5]], initial_state=state)
    outs.append(out)
  _close(jnp.concatenate(outs, axis=1), whole_out[:, 40:])
  _close(state, whole_final)


def _grads(rule, args, weights):
  """Gradients of a weighted sum of the rule's outputs and final state w.r.t. q, k, v, g, beta, initial_state."""
  w_out, w_state = weights

  def loss(*xs):
    out, final = rule(*xs[:5], initial_state=xs[5])
    return jnp.sum(out * w_out) + jnp.sum(final * w_state)

  return jax.jit(jax.grad(loss, argnums=range(6)))(*args)


def test_gradients_equal_recurrent():
  args = _rule_inputs(1, 21, seed=9, state=True)
  rng = np.random.default_rng(10)
  weights = rng.normal(size=args[2].shape).astype(np.float32), rng.normal(size=args[5].shape).astype(np.float32)
  got = _grads(functools.partial(chunk_gated_delta, chunk_size=8), args, weights)
  want = _grads(recurrent_gated_delta, args, weights)
  for x, y, name in zip(got, want, ["q", "k", "v", "g", "beta", "initial_state"]):
    assert np.all(np.isfinite(np.asarray(x))), name
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-5, err_msg=name)


def test_packed_gradients_equal_each_alone():
  """Gradients through a packed row (initial state read by its first segment) equal those through its segments
  run alone, recurrently."""
  lengths = ROWS[0]
  segments = segment_rows.segments([lengths], T_ROW)
  args = _rule_inputs(1, T_ROW, seed=11, state=True)
  rng = np.random.default_rng(12)
  weights = rng.normal(size=args[2].shape).astype(np.float32), rng.normal(size=args[5].shape).astype(np.float32)

  def packed(*xs, initial_state):
    return chunk_gated_delta(*xs, initial_state=initial_state, segments=segments, chunk_size=8)

  def alone(*xs, initial_state):
    outs = []
    for i, piece in enumerate(_segment_slices(lengths)):
      out, final = recurrent_gated_delta(*[x[:, piece] for x in xs], initial_state=initial_state if i == 0 else None)
      outs.append(out)
    return jnp.concatenate(outs, axis=1), final

  for x, y, name in zip(_grads(packed, args, weights), _grads(alone, args, weights), "q k v g beta state".split()):
    assert np.all(np.isfinite(np.asarray(x))), name
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-5, err_msg=name)


def test_bfloat16_inputs():
  """bf16 in, bf16 out (float32 inside), the final state float32; close to the float32 rule on the rounded inputs."""
  args = _rule_inputs(1, 24, seed=13, state=True)
  bf16 = [jnp.asarray(x, jnp.bfloat16) for x in args[:5]]
  out, final = _chunk(*bf16, initial_state=args[5], chunk_size=8)
  want_out, want_final = _chunk(*[x.astype(jnp.float32) for x in bf16], initial_state=args[5], chunk_size=8)
  assert out.dtype == jnp.bfloat16 and final.dtype == jnp.float32
  _close(out.astype(jnp.float32), want_out, tol=2e-2)
  _close(final, want_final)


# conv: B = 2 rows, Ch = 6 channels, K = 4 taps (Qwen3.5's linear_conv_kernel_dim)
CH, TAPS = 6, 4


def _conv_inputs(t, seed):
  rng = np.random.default_rng(seed)
  return rng.normal(size=(2, t, CH)).astype(np.float32), rng.normal(size=(CH, TAPS)).astype(np.float32)


def test_conv_equals_transformers():
  x, w = _conv_inputs(11, seed=20)
  y, state = causal_conv1d(x, w)
  want = causal_conv1d_fn(torch.from_numpy(x).transpose(1, 2), torch.from_numpy(w), activation="silu")
  _close(y, want.transpose(1, 2).numpy(), tol=1e-6)
  np.testing.assert_array_equal(np.asarray(state), x[:, -(TAPS - 1) :])


def test_conv_state_continues():
  """The conv over x2 from x1's state equals the conv over [x1; x2] (and transformers' update form); decode steps
  of one token each (T < K - 1: the new state keeps part of the old) too."""
  x, w = _conv_inputs(14, seed=21)
  whole, whole_state = causal_conv1d(x, w)
  _, state = causal_conv1d(x[:, :9], w)
  y, new_state = causal_conv1d(x[:, 9:12], w, state=state)
  _close(y, whole[:, 9:12], tol=1e-6)
  conv_state = torch.from_numpy(np.asarray(state)).transpose(1, 2).contiguous()  # HF's [B, Ch, K - 1]
  want = causal_conv1d_update(
    torch.from_numpy(x[:, 9:12]).transpose(1, 2), conv_state, torch.from_numpy(w), None, "silu"
  )
  _close(y, want.transpose(1, 2).numpy(), tol=1e-6)
  np.testing.assert_array_equal(np.asarray(new_state), conv_state.transpose(1, 2).numpy())  # updated in place
  for i in (12, 13):
    y, new_state = causal_conv1d(x[:, i : i + 1], w, state=new_state)
    _close(y, whole[:, i : i + 1], tol=1e-6)
  np.testing.assert_array_equal(np.asarray(new_state), np.asarray(whole_state))


def test_conv_segments_do_not_leak():
  """Packed rows: a change in a segment moves no other segment's outputs; each segment's outputs are its own conv
  alone; with a state, the first segment reads it; the new state holds the last segment's inputs only."""
  lengths = [5, 2, 6]
  segments = segment_rows.segments([lengths, [13]], 13)
  x, w = _conv_inputs(13, seed=22)
  state = np.random.default_rng(23).normal(size=(2, TAPS - 1, CH)).astype(np.float32)
  y, new_state = causal_conv1d(x, w, state=state, segments=segments)
  x2 = x.copy()
  x2[0, 5:7] += 5.0  # the second segment
  y2, _ = causal_conv1d(x2, w, state=state, segments=segments)
  assert np.max(np.abs(y2[0, 5:7] - y[0, 5:7])) > 0.1
  np.testing.assert_array_equal(np.asarray(y2[0, :5]), np.asarray(y[0, :5]))
  np.testing.assert_array_equal(np.asarray(y2[0, 7:]), np.asarray(y[0, 7:]))
  for i, piece in enumerate([slice(0, 5), slice(5, 7), slice(7, 13)]):
    want, _ = causal_conv1d(x[:1, piece], w, state=state[:1] if i == 0 else None)
    _close(y[:1, piece], want, tol=1e-6)
  _close(y[1:], causal_conv1d(x[1:], w, state=state[1:])[0], tol=1e-6)  # one segment: as without segments
  np.testing.assert_array_equal(np.asarray(new_state[0]), x[0, 10:])  # the last segment is 6 long: all of it
  short = segment_rows.segments([[11, 2]], 13)  # the last segment is 2 long: the older slot is another's
  _, new_state = causal_conv1d(x[:1], w, segments=short)
  np.testing.assert_array_equal(np.asarray(new_state[0]), np.concatenate([np.zeros((1, CH)), x[0, 11:]]))


@pytest.mark.parametrize(
  "dtype, weight_dtype",
  [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32)],
)
def test_gated_rms_norm_equals_transformers(dtype, weight_dtype):
  """float32; bfloat16 with a bfloat16 weight (HF loaded in bf16) and with a float32 one (float32 params, bf16
  compute): the weight multiplies the normed x in the promoted dtype, not rounded to bf16 first."""
  torch.manual_seed(0)
  norm = hf.Qwen3_5RMSNormGated(64, eps=1e-6)
  with torch.no_grad():
    norm.weight.add_(0.3 * torch.randn(64))
  norm = norm.to(weight_dtype)
  x, gate = (2.0 * torch.randn(16, 5, 64)).to(dtype), torch.randn(16, 5, 64).to(dtype)
  with torch.no_grad():
    want = norm(x, gate).float().numpy()
  as_jnp = lambda t: jnp.asarray(t.detach().float().numpy()).astype(str(t.dtype).removeprefix("torch."))
  got = gated_rms_norm(as_jnp(x), as_jnp(gate), as_jnp(norm.weight), 1e-6)
  assert got.dtype == as_jnp(x).dtype
  got = np.asarray(got, np.float32)
  if dtype == torch.float32:
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  else:  # measured bit-exact; a bf16-rounded f32 weight moves ~40% of the outputs by a bf16 step or two
    assert np.mean(got != want) < 0.01
    np.testing.assert_allclose(got, want, rtol=8e-3, atol=8e-3)


@pytest.mark.parametrize("c", [1, 2, 8, 64])
def test_unit_lower_inverse_equals_numpy(c):
  """The block-doubling inverse of a unit-lower-triangular matrix (the chunk's solve) equals numpy's inverse; only
  the strict lower triangle is read."""
  from jaxcap.models.gated_delta import unit_lower_inverse

  rng = np.random.RandomState(c)
  a = np.tril(rng.randn(3, c, c) * 0.3, -1) + np.triu(rng.randn(3, c, c))  # garbage on and above the diagonal
  want = np.linalg.inv(np.tril(a, -1) + np.eye(c))
  np.testing.assert_allclose(np.asarray(unit_lower_inverse(jnp.asarray(a, jnp.float32))), want, rtol=1e-4, atol=1e-5)
