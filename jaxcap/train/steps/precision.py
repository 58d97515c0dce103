"""Applying optimizer updates to low-precision (bfloat16) master weights without rounding them away.

At fine-tuning learning rates an AdamW update is ~lr per weight, far below half a bfloat16 ulp of a weight of
typical size (|w| ~ 1e-2 has ulp 6e-5), so `optax.apply_updates` (round to nearest) drops most of them: on a
2048x11008 kernel at lr 1e-6, under 1% of the weights change per step. The default for real checkpoints is
therefore float32 master weights with bfloat16 compute (`model.param_dtype="float32"`, `model.dtype="bfloat16"`).
Where bfloat16 master weights are wanted (half the memory), `optim.master_update` chooses how updates land:

- "exact": `optax.apply_updates`, round to nearest; right for float32 params, loses small updates in bfloat16.
- "stochastic_rounding": param + update in float32, rounded to one of its two neighbouring bfloat16 values with
  probability proportional to closeness, so the expected new weight is the float32 one and small updates land
  on average (unbiased); the random bits come from the train state's key and step (`update_key`), so a run is
  reproducible from its config and seed. The rounding noise is zero-mean but not small: each weight jumps a whole
  ulp now and then, so over T steps it wanders ~sqrt(T * lr * ulp) about the float32 path (with uncorrelated
  gradients at lr 1e-6 that is ~4-5x the float32 drift itself; its mean along the path matches to 0.1%).

Float32 leaves take the plain float32 sum in every mode.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from jaxcap.choices import MASTER_UPDATES  # noqa: F401  (re-exported)


# fold_in tag of the rounding stream, beyond any step count so it cannot meet `fold_in(state.key, step)`,
# which RL sampling uses.
_ROUNDING_STREAM = 0x5352_0001


def check_mode(mode: str) -> None:
  if mode not in MASTER_UPDATES:
    raise ValueError(f"optim.master_update={mode!r}; choose one of {', '.join(MASTER_UPDATES)}")


def update_key(key: jax.Array, step: jax.Array) -> jax.Array:
  """The rounding key of update `step`: a deterministic function of the run's key and the step."""
  return jax.random.fold_in(jax.random.fold_in(key, _ROUNDING_STREAM), step)


def stochastic_round(x: jax.Array, key: jax.Array, dtype=jnp.bfloat16) -> jax.Array:
  """`x` rounded to bfloat16 stochastically: up (in magnitude) with probability (|x| - lo) / (hi - lo) where lo, hi
  are its neighbouring bfloat16 values, so E[result] = x. Adds 16 uniform random bits to the float32 bit pattern
  (below bfloat16's mantissa) and truncates them; the carry into the exponent gives the right neighbour across
  binades. Non-finite values pass through."""
  if jnp.dtype(dtype) != jnp.dtype(jnp.bfloat16):
    raise ValueError(f"stochastic rounding targets bfloat16, not {jnp.dtype(dtype).name}")
  x = x.astype(jnp.float32)
  bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
  noise = jax.random.bits(key, x.shape, jnp.uint32) >> 16
  rounded = jax.lax.bitcast_convert_type((bits + noise) & jnp.uint32(0xFFFF0000), jnp.float32)
  # the low 16 bits are zero, so this cast is exact; sums that round past the largest finite bf16 become inf
  return jnp.where(jnp.isfinite(x), rounded, x).astype(dtype)


def _sum_to(p: jax.Array, u: jax.Array, key: jax.Array, mode: str) -> jax.Array:
  if mode == "stochastic_rounding" and p.dtype == jnp.bfloat16:
    return stochastic_round(p.astype(jnp.float32) + u.astype(jnp.float32), key)
  return jnp.asarray(p + u).astype(p.dtype)


def apply_updates(params, updates, *, mode: str = "exact", key: jax.Array | None = None):
  """`params + updates` with each leaf kept in its dtype, bfloat16 leaves rounded as `mode` says (see module doc).
  `key` (e.g. `update_key(state.key, state.step)`) is needed for "stochastic_rounding"; each leaf draws from its
  own fold of it (by position in the flattened tree)."""
  check_mode(mode)
  if mode == "exact":
    return optax.apply_updates(params, updates)
  if key is None:
    raise ValueError(f"master_update={mode!r} needs a PRNG key")
  leaves, treedef = jax.tree.flatten(params)
  u_leaves = treedef.flatten_up_to(updates)
  out = [_sum_to(p, u, jax.random.fold_in(key, i), mode) for i, (p, u) in enumerate(zip(leaves, u_leaves, strict=True))]
  return jax.tree.unflatten(treedef, out)


def float32_state(tx: optax.GradientTransformation) -> optax.GradientTransformation:
  """`tx` with its state initialised from float32 copies of the params.

  optax's Adam takes its moments' dtype from the params at init, but the steps feed it float32 gradients
  (accumulated in float32): with bfloat16 params, `mu` turned float32 after the first update (a second
  compilation of the step) and `nu` stayed bfloat16, where it can never decay (0.999 * nu + 0.001 * g^2 rounds back
  to nu unless g^2 > ~3 nu). Initialised from float32 params, every moment is float32 from the start and the
  state's dtypes never change."""

  def init(params):
    f32 = lambda x: x.astype(jnp.float32) if jnp.issubdtype(x.dtype, jnp.floating) else x
    return tx.init(jax.tree.map(f32, params))

  return optax.GradientTransformation(init, tx.update)
