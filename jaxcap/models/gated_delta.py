"""The Gated DeltaNet token mixer of Qwen3.5's linear-attention layers (transformers `Qwen3_5GatedDeltaNet`), as
pure functions: the gated delta rule in chunked (prefill / training) and recurrent (decode) form, the depthwise
causal conv in front of it and the gated RMSNorm after it. The Flax layer composes them.

The rule, per value head, with state S [Dk, Dv] (float32), for each token t in order:
  S <- exp(g_t) S;  S <- S + k_t (beta_t (v_t - S^T k_t))^T;  o_t = S^T q_t
q and k L2-normalised (eps 1e-6, transformers' `l2norm`, `use_qk_l2norm_in_kernel=True`), q also scaled by Dk^-0.5.
`chunk_gated_delta` computes it C tokens at a time (the WY / UT form of transformers' `torch_chunk_gated_delta_rule`):
within a chunk by one unit-lower-triangular solve and matmuls, across chunks by a `lax.scan` carrying S.

Packed rows (`segments`): several sequences end to end in one row; the state resets at each segment start, so a
segment's outputs are those of the segment run alone from a zero state. The resets are masks (pairwise terms of a
chunk only within a segment, the carried state read only by the chunk's tokens of the segment it belongs to, carried
out only into the chunk's last segment), never a large negative g: float32 cumulative sums of g would lose the
real decays next to it. An `initial_state` (and a conv `state`) belongs to the row's first segment, whichever id it
has; the final state is that of the row's last segment. Padding is a segment like any other (id 0 or not); tokens
with g = 0 and beta = 0 leave the state unchanged, so giving right padding the last real segment's id and g = beta
= 0 carries that segment's state out of the row.

Accelerated kernels: none is used. ejkernel 0.0.80 (PyPI, Apache-2.0, jax ~= 0.10) has `gated_delta_rule` with
the same layout and conventions, but its TPU "Pallas" entry runs multi-token inputs through its XLA chunked path
(a jnp implementation like this one, with exps clipped to [-20, 20]), only decode steps (T = 1) in a Pallas
kernel; its GPU entry is a token-sequential TileLang scan (the `tilelang` extra, CUDA 13); neither takes segments
(packed rows fall back to the XLA path), and its public entry autotunes at call time. tokamax 0.0.12 has no delta
rule; fla-jax / flash-linear-attention-jax are not on PyPI. Levanter's GatedDeltaNet carries Pallas kernels, but
inside its haliax / equinox layer, not as a library function.

Shapes: B batch, T tokens, Hk query / key heads, Hv value heads (a multiple of Hk: q / k head h serves value heads
h * R ... h * R + R - 1, R = Hv / Hk, as transformers' repeat_interleave), Dk key dim, Dv value dim, C chunk tokens,
N chunks, K conv taps, Ch conv channels. Matmuls run at jax's default precision (exact float32 on CPU, fewer
bf16 passes on TPU: set `jax_default_matmul_precision` for float32 there), but for the intra-chunk inverse: HIGHEST.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

L2_EPS = 1e-6  # transformers' l2norm (and FLA's) for q and k inside the rule


def _l2norm(x: jax.Array) -> jax.Array:
  return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + L2_EPS)


def _inputs(q, k, v, g, beta, initial_state):
  """float32, value heads grouped by their key head: q (normalised, scaled) and k [B, T, Hk, Dk], v
  [B, T, Hk, R, Dv], g and beta [B, T, Hk, R], the state [B, Hk, R, Dk, Dv] (zeros if None)."""
  b, t, hk, dk = k.shape
  hv, dv = v.shape[2:]
  if hv % hk:
    raise ValueError(f"{hv} value heads are not a multiple of {hk} key heads")
  r = hv // hk
  f32 = lambda x: x.astype(jnp.float32)
  q = _l2norm(f32(q)) * dk**-0.5
  k = _l2norm(f32(k))
  v = f32(v).reshape(b, t, hk, r, dv)
  g, beta = (f32(x).reshape(b, t, hk, r) for x in (g, beta))
  if initial_state is None:
    state = jnp.zeros((b, hk, r, dk, dv), jnp.float32)
  else:
    state = f32(initial_state).reshape(b, hk, r, dk, dv)
  return q, k, v, g, beta, state


def unit_lower_inverse(a: jax.Array) -> jax.Array:
  """The inverse of unit-lower-triangular a [..., C, C] (C a power of two; only the strict lower triangle is read),
  by block doubling: inverses of the diagonal blocks of size s give those of size 2s,
  [[A, 0], [B, D]]^-1 = [[A^-1, 0], [-D^-1 B A^-1, D^-1]], log2(C) rounds of batched matmuls.

  Not `solve_triangular`: on CPU that is LAPACK through scipy's OpenBLAS, whose threads deadlocked against XLA's
  in a gradient of this rule (one run in three of a [8, 512] backward never returned); matmuls also suit TPUs."""
  c = a.shape[-1]
  if c & (c - 1):
    raise ValueError(f"unit_lower_inverse needs a power-of-two size, got {c}")
  lead = a.shape[:-2]
  mm = lambda x, y: jnp.matmul(x, y, precision=jax.lax.Precision.HIGHEST)
  inv = jnp.ones((*lead, c, 1, 1), a.dtype)  # [..., C / s, s, s]: the inverted diagonal blocks of size s
  s = 1
  while s < c:
    nb = c // (2 * s)
    pairs = inv.reshape(*lead, nb, 2, s, s)
    upper, lower = pairs[..., 0, :, :], pairs[..., 1, :, :]
    blocks = a.reshape(*lead, nb, 2 * s, nb, 2 * s)
    idx = jnp.arange(nb)
    diag = blocks[..., idx, :, idx, :]  # [nb, ..., 2s, 2s]: advanced indices first
    b = jnp.moveaxis(diag, 0, -3)[..., s:, :s]  # [..., nb, s, s]
    off = -mm(mm(lower, b), upper)
    top = jnp.concatenate([upper, jnp.zeros_like(upper)], axis=-1)
    bottom = jnp.concatenate([off, lower], axis=-1)
    inv = jnp.concatenate([top, bottom], axis=-2)  # [..., nb, 2s, 2s]
    s *= 2
  return inv.reshape(*lead, c, c)


def _runs(segments: jax.Array) -> jax.Array:
  """int32 [B, T]: each token's segment counted from its row's start, 0 for the first whatever its id: a segment
  is a run of equal ids, so only changes of id matter."""
  starts = segments[:, 1:] != segments[:, :-1]
  return jnp.pad(jnp.cumsum(starts, axis=1, dtype=jnp.int32), ((0, 0), (1, 0)))


def recurrent_gated_delta(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  g: jax.Array,
  beta: jax.Array,
  *,
  initial_state: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
  """The rule token by token, a `lax.scan` over T (decode steps, T = 1; the reference of the chunked form).

  q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv]; g (log decay, <= 0) and beta [B, T, Hv]; initial_state [B, Hv, Dk, Dv]
  or None (zeros) -> (out [B, T, Hv, Dv] in q's dtype, final state [B, Hv, Dk, Dv] float32)."""
  dtype = q.dtype
  b, t, hv, dv = v.shape
  dk = k.shape[-1]
  q, k, v, g, beta, state = _inputs(q, k, v, g, beta, initial_state)

  def step(s, xs):
    q_t, k_t, v_t, g_t, beta_t = xs  # [B, Hk, Dk] x2, [B, Hk, R, Dv], [B, Hk, R] x2
    s = s * jnp.exp(g_t)[..., None, None]
    delta = (v_t - jnp.einsum("bhk,bhrkv->bhrv", k_t, s)) * beta_t[..., None]
    s = s + k_t[:, :, None, :, None] * delta[..., None, :]
    return s, jnp.einsum("bhk,bhrkv->bhrv", q_t, s)

  time_major = lambda x: jnp.moveaxis(x, 1, 0)
  state, out = jax.lax.scan(step, state, tuple(map(time_major, (q, k, v, g, beta))))
  return time_major(out).reshape(b, t, hv, dv).astype(dtype), state.reshape(b, hv, dk, dv)


def chunk_gated_delta(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  g: jax.Array,
  beta: jax.Array,
  *,
  initial_state: jax.Array | None = None,
  segments: jax.Array | None = None,
  chunk_size: int = 64,
) -> tuple[jax.Array, jax.Array]:
  """The rule C = min(chunk_size, T) tokens at a time (prefill, training); the recurrent form's results to float
  rounding.

  q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv]; g (log decay, <= 0) and beta [B, T, Hv]; initial_state [B, Hv, Dk, Dv]
  or None (zeros), read by the row's first segment; segments int [B, T] or None (one sequence per row) -> (out
  [B, T, Hv, Dv] in q's dtype, final state [B, Hv, Dk, Dv] float32, that of the row's last segment)."""
  dtype = q.dtype
  b, t, hv, dv = v.shape
  hk, dk = k.shape[2:]
  q, k, v, g, beta, state = _inputs(q, k, v, g, beta, initial_state)
  r = hv // hk
  c = min(chunk_size, 1 << max(t - 1, 0).bit_length())  # a power of two (`unit_lower_inverse`)
  n = -(-t // c)
  # padding with k = v = g = beta = 0, in the last segment: beta = 0 writes nothing, g = 0 decays nothing, so the
  # state leaves the last chunk as it was after the last real token
  pad = lambda x: jnp.pad(x, [(0, 0), (0, n * c - t)] + [(0, 0)] * (x.ndim - 2))
  # [B, N, Hk, C, Dk] and [B, N, Hk, R, C, ...]: per chunk, time next to the feature dims for the matmuls
  q, k = (pad(x).reshape(b, n, c, hk, dk).transpose(0, 1, 3, 2, 4) for x in (q, k))
  v = pad(v).reshape(b, n, c, hk, r, dv).transpose(0, 1, 3, 4, 2, 5)
  g, beta = (pad(x).reshape(b, n, c, hk, r).transpose(0, 1, 3, 4, 2) for x in (g, beta))

  causal = jnp.tril(jnp.ones((c, c), bool))  # [i, j]: j <= i
  if segments is None:
    read = last = 1.0
    visible = causal
  else:
    runs = jnp.pad(_runs(segments), ((0, 0), (0, n * c - t)), mode="edge").reshape(b, n, c)
    # the state entering chunk i is that of the segment of chunk i - 1's last token (of the first, for chunk 0)
    entering = jnp.pad(runs[:, :-1, -1], ((0, 0), (1, 0)))
    to_heads = lambda m: m[:, :, None, None].astype(jnp.float32)  # [B, N, 1, 1, C]
    read = to_heads(runs == entering[..., None])  # tokens that read the entering state
    last = to_heads(runs == runs[..., -1:])  # tokens whose writes leave the chunk
    visible = causal & (runs[..., :, None] == runs[..., None, :])[:, :, None, None]  # [B, N, 1, 1, C, C]

  cum = jnp.cumsum(g, axis=-1)  # [B, N, Hk, R, C]: log decay from the chunk's start to each token, inclusive
  # decay[i, j] = exp(cum_i - cum_j), the decay from token j to token i, where j may reach i (else 0; the inner
  # where keeps exp's argument <= 0 so neither it nor its gradient overflows)
  decay = jnp.where(visible, jnp.exp(jnp.where(visible, cum[..., :, None] - cum[..., None, :], 0.0)), 0.0)
  kk = jnp.einsum("bnhid,bnhjd->bnhij", k, k)[:, :, :, None]  # [B, N, Hk, 1, C, C]
  qk = jnp.einsum("bnhid,bnhjd->bnhij", q, k)[:, :, :, None]
  # token i's write u_i = beta_i (v_i - S_i^T k_i) reads the state after the earlier writes of its segment in
  # the chunk: (I + L) u = beta v - beta exp(cum) k S_entering, L[i, j] = beta_i decay[i, j] k_i.k_j (j < i)
  lower = (kk * decay * beta[..., :, None]) * (1.0 - jnp.eye(c))
  k_beta = k[:, :, :, None] * beta[..., None]
  rhs = jnp.concatenate([v * beta[..., None], k_beta * (jnp.exp(cum) * read)[..., None]], axis=-1)
  solved = jnp.matmul(unit_lower_inverse(lower), rhs, precision=jax.lax.Precision.HIGHEST)
  u_local, w = solved[..., :dv], solved[..., dv:]  # u = u_local - w S_entering
  attn = qk * decay  # [B, N, Hk, R, C, C]: o_i = q_i . (exp(cum_i) S_entering + sum_j decay[i, j] k_j u_j^T)
  q_read = q[:, :, :, None] * (jnp.exp(cum) * read)[..., None]
  k_out = k[:, :, :, None] * (jnp.exp(cum[..., -1:] - cum) * last)[..., None]  # writes as they leave the chunk
  keep = jnp.exp(cum[..., -1]) * (read[..., -1] if segments is not None else 1.0)  # [B, N, Hk, R]

  def chunk(s, xs):
    u_local, w, attn, q_read, k_out, keep = xs
    u = u_local - jnp.einsum("bhrck,bhrkv->bhrcv", w, s)
    o = jnp.einsum("bhrck,bhrkv->bhrcv", q_read, s) + jnp.einsum("bhrij,bhrjv->bhriv", attn, u)
    s = s * keep[..., None, None] + jnp.einsum("bhrck,bhrcv->bhrkv", k_out, u)
    return s, o

  chunk_major = lambda x: jnp.moveaxis(x, 1, 0)
  state, out = jax.lax.scan(chunk, state, tuple(map(chunk_major, (u_local, w, attn, q_read, k_out, keep))))
  out = out.transpose(1, 0, 4, 2, 3, 5).reshape(b, n * c, hv, dv)[:, :t]  # [N, B, Hk, R, C, Dv] -> [B, T, Hv, Dv]
  return out.astype(dtype), state.reshape(b, hv, dk, dv)


def causal_conv1d(
  x: jax.Array,
  weight: jax.Array,
  *,
  state: jax.Array | None = None,
  segments: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
  """Depthwise causal conv over time, then SiLU (transformers' causal_conv1d_fn / _update, activation "silu", no
  bias), channels last.

  x [B, T, Ch]; weight [Ch, K] (HF's conv1d.weight [Ch, 1, K] squeezed: weight[:, K - 1] multiplies the current
  token); state [B, K - 1, Ch], the K - 1 inputs before x (zeros or None for a fresh sequence), read by the row's
  first segment; segments int [B, T] or None: a token reads inputs of its own segment only -> (y [B, T, Ch] in x's
  dtype, new state [B, K - 1, Ch]: the last K - 1 inputs, the state's included while T < K - 1, zero where they are
  not of the row's last segment). Padded tokens need nothing special: the caller zeroes their inputs."""
  b, t, ch = x.shape
  taps = weight.shape[-1]
  if state is None:
    state = jnp.zeros((b, taps - 1, ch), x.dtype)
  window = jnp.concatenate([state.astype(x.dtype), x], axis=1)  # [B, K - 1 + T, Ch]
  xs, w = window.astype(jnp.float32), weight.astype(jnp.float32)
  if segments is not None:
    # the state's slots are of the first segment (run 0); token i reads slot i + j (of window) iff the same run
    runs = jnp.pad(_runs(segments), ((0, 0), (taps - 1, 0)))
    xs = [xs[:, j : j + t] * (runs[:, j : j + t] == runs[:, taps - 1 :])[..., None] for j in range(taps)]
    new_state = window[:, t:] * (runs[:, t:] == runs[:, -1:])[..., None].astype(x.dtype)
  else:
    xs = [xs[:, j : j + t] for j in range(taps)]
    new_state = window[:, t:]
  y = sum(xs[j] * w[:, j] for j in range(taps))
  return jax.nn.silu(y).astype(x.dtype), new_state


def gated_rms_norm(x: jax.Array, gate: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
  """Qwen3_5RMSNormGated: RMSNorm of x [..., D] in float32 back in x's dtype, times weight [D] (in the promoted
  dtype, as torch), times silu(gate [..., D]) in float32 -> [..., D] in x's dtype."""
  dtype = x.dtype
  x32 = x.astype(jnp.float32)
  x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  y = weight * x32.astype(dtype)
  return (y * jax.nn.silu(gate.astype(jnp.float32))).astype(dtype)
