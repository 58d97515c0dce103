"""Master-weight precision: stochastic rounding is unbiased, bfloat16-compute runs move like float32 runs at
fine-tuning learning rates, the optimizer state keeps its dtypes, and the config refuses bfloat16 masters that
would round updates away."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxcap.models as M
from jaxcap.models.vision import vision_layout
from jaxcap.train.steps import precision
from jaxcap.config_files import base_config, real_model_run, validate
from jaxcap.config.training import Optim
from jaxcap.train.steps.state import init_train_state, make_optimizer
from jaxcap.train.steps.updates import PromptBatch, sft_step

CFG = M.tiny()
B, P, C = 4, 12, 6


def _neighbours(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """The bfloat16 values either side of float32 `x`: truncated toward zero, and one bfloat16 ulp further out."""
  bits = x.astype(np.float32).view(np.uint32) & np.uint32(0xFFFF0000)
  return bits.view(np.float32), (bits + np.uint32(0x10000)).view(np.float32)


def test_stochastic_rounding_is_unbiased_and_lands_on_a_neighbouring_bfloat16():
  rng = np.random.default_rng(0)
  # typical weights of both signs, values just under a power of two (the upper neighbour is in the next binade),
  # tiny and large magnitudes
  x = np.concatenate(
    [
      rng.normal(0, 0.02, 24),
      [0.9999, -0.49999, 1.0 - 1e-7, 3e-30, -7.5e20, 1.2345e-3, -1.2345e-3],
    ]
  ).astype(np.float32)
  n = 20000
  out = precision.stochastic_round(jnp.broadcast_to(jnp.asarray(x), (n, x.size)), jax.random.key(0))
  assert out.dtype == jnp.bfloat16
  out = np.asarray(out.astype(jnp.float32))
  lo, hi = _neighbours(x)
  assert np.all((out == lo) | (out == hi))
  p = (np.abs(x) - np.abs(lo)) / (np.abs(hi) - np.abs(lo))  # probability of rounding away from zero
  sigma = np.abs(hi - lo) * np.sqrt(p * (1 - p) / n)
  np.testing.assert_array_less(np.abs(out.mean(0) - x), 5 * sigma + 1e-3 * np.abs(hi - lo))
  # both neighbours occur wherever each has probability >= 5%
  both = (p > 0.05) & (p < 0.95)
  assert np.all((out == lo).any(0)[both] & (out == hi).any(0)[both])


def test_stochastic_rounding_keeps_bfloat16_values_and_non_finite_values():
  exact = jnp.asarray([0.0, -0.0, 1.0, -0.015625, 3.0e-3], jnp.bfloat16).astype(jnp.float32)
  for k in range(5):
    np.testing.assert_array_equal(precision.stochastic_round(exact, jax.random.key(k)).astype(jnp.float32), exact)
  special = precision.stochastic_round(jnp.asarray([jnp.inf, -jnp.inf, jnp.nan]), jax.random.key(0))
  np.testing.assert_array_equal(np.asarray(special.astype(jnp.float32)), [np.inf, -np.inf, np.nan])


def test_apply_updates_modes():
  params = {"w": jnp.full((64, 64), 0.02, jnp.bfloat16), "b": jnp.zeros((64,), jnp.float32)}
  updates = {"w": jnp.full((64, 64), 1e-6, jnp.float32), "b": jnp.full((64,), 1e-6, jnp.float32)}
  exact = precision.apply_updates(params, updates, mode="exact")
  plain = optax.apply_updates(params, updates)
  jax.tree.map(np.testing.assert_array_equal, exact, plain)
  np.testing.assert_array_equal(exact["w"], params["w"])  # 1e-6 is far below half an ulp of 0.02 (6e-5)
  key = jax.random.key(3)
  sr = precision.apply_updates(params, updates, mode="stochastic_rounding", key=key)
  assert jax.tree.map(lambda a: a.dtype, sr) == jax.tree.map(lambda a: a.dtype, params)
  np.testing.assert_array_equal(sr["b"], updates["b"])  # float32 leaves: the plain sum
  moved = float(jnp.mean(sr["w"] != params["w"]))
  assert 0 < moved < 0.1, moved  # P(up) = 1e-6 / ulp(0.02) = 0.8%
  jax.tree.map(
    np.testing.assert_array_equal, sr, precision.apply_updates(params, updates, mode="stochastic_rounding", key=key)
  )
  with pytest.raises(ValueError, match="needs a PRNG key"):
    precision.apply_updates(params, updates, mode="stochastic_rounding")
  with pytest.raises(ValueError, match="master_update='nearest'"):
    precision.apply_updates(params, updates, mode="nearest")
  # each step of a run draws fresh rounding bits, reproducibly
  k0, k1 = precision.update_key(key, jnp.int32(0)), precision.update_key(key, jnp.int32(1))
  assert not np.array_equal(jax.random.key_data(k0), jax.random.key_data(k1))
  np.testing.assert_array_equal(jax.random.key_data(k0), jax.random.key_data(precision.update_key(key, 0)))


def _batch(rng):
  """B prompts of P tokens with one 28x28 image each (one micro-batch), and C target tokens per prompt."""
  ids = rng.integers(0, 400, (B, P)).astype(np.int32)
  mask = np.ones((B, P), bool)
  for b in range(B):
    mask[b, :b] = False
    ids[b, b + 1] = CFG.image_token_id
  pos = np.broadcast_to(np.cumsum(mask, 1) - 1, (3, B, P)).astype(np.int32)
  pixels = rng.normal(size=(B * 4, CFG.vision.patch_dim)).astype(np.float32)
  prompts = PromptBatch(ids[None], pos[None], mask[None], pixels[None])
  layout = vision_layout(np.array([[1, 2, 2]] * B), CFG.vision)
  targets = rng.integers(0, 400, (1, B, C)).astype(np.int32)
  return prompts, layout, targets, np.ones((1, B, C), bool)


def _init_params():
  return nnx.split(M.Qwen25VL(CFG, rngs=nnx.Rngs(0)))[1]


def _run(params0, dtype, master_update="exact", lr=1e-6, steps=8, seed=1):
  """`steps` SFT updates (AdamW, constant lr) of the tiny model computing in `dtype` from `params0` (whose
  dtype is the master dtype); returns the displacement of every weight, flattened, float32."""
  graphdef = nnx.split(M.Qwen25VL(CFG.replace(dtype=dtype), rngs=nnx.Rngs(0)))[0]
  prompts, layout, targets, mask = _batch(np.random.default_rng(0))
  opt = make_optimizer(Optim(lr, schedule="constant"), 100)
  state = init_train_state(params0, opt, jax.random.key(seed))
  step = jax.jit(
    lambda s: sft_step(s, prompts, targets, mask, layout, graphdef=graphdef, optimizer=opt, master_update=master_update)
  )
  for _ in range(steps):
    state, _ = step(state)
  delta = jax.tree.map(lambda a, b: (a.astype(jnp.float32) - b.astype(jnp.float32)).ravel(), state.params, params0)
  return jnp.concatenate(jax.tree.leaves(delta))


@pytest.mark.slow
def test_bfloat16_compute_runs_move_like_float32_runs_at_lr_1e_6():
  params = _init_params()
  bf16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
  ref = _run(params, jnp.float32)
  norm = lambda d: float(jnp.linalg.norm(d))
  along = lambda d: float(jnp.vdot(d, ref)) / norm(ref) ** 2  # mean movement along the float32 run's path
  # float32 masters, bfloat16 compute (the real-checkpoint default): same drift within 1%
  f32_master = _run(params, jnp.bfloat16)
  assert abs(norm(f32_master) / norm(ref) - 1) < 0.01, norm(f32_master) / norm(ref)
  assert abs(along(f32_master) - 1) < 0.01, along(f32_master)
  # bfloat16 masters, round to nearest: most updates are lost (measured: along 0.034, |drift| 0.22 of float32's)
  exact = _run(bf16, jnp.bfloat16)
  assert along(exact) < 0.5, along(exact)
  # bfloat16 masters, stochastic rounding: unbiased, so it moves along the float32 path as far as float32 does
  # (measured 1.000; std 0.008 over rounding seeds); its zero-mean rounding noise lies across the path (|drift|
  # 3.8x float32's at lr 1e-6)
  sr = _run(bf16, jnp.bfloat16, "stochastic_rounding")
  assert abs(along(sr) - 1) < 0.03, along(sr)
  assert along(sr) > 2 * along(exact)


# each dtype once, one of them with a frozen tower: a full SFT step compile per case
@pytest.mark.slow
@pytest.mark.parametrize(("param_dtype", "frozen"), [(jnp.float32, ("visual",)), (jnp.bfloat16, ())])
def test_optimizer_state_dtypes_are_fixed_from_init(param_dtype, frozen):
  params = jax.tree.map(lambda x: x.astype(param_dtype), _init_params())
  graphdef = nnx.split(M.Qwen25VL(CFG.replace(dtype=jnp.bfloat16), rngs=nnx.Rngs(0)))[0]
  prompts, layout, targets, mask = _batch(np.random.default_rng(1))
  opt = make_optimizer(Optim(1e-5), 100, frozen=frozen)
  state = init_train_state(params, opt, jax.random.key(0))
  mode = "stochastic_rounding" if param_dtype == jnp.bfloat16 else "exact"
  step = jax.jit(
    lambda s: sft_step(s, prompts, targets, mask, layout, graphdef=graphdef, optimizer=opt, master_update=mode)
  )
  dtypes = lambda tree: jax.tree.map(lambda x: x.dtype, tree)
  floats = [x.dtype for x in jax.tree.leaves(state.opt_state) if jnp.issubdtype(x.dtype, jnp.floating)]
  assert floats and all(d == jnp.float32 for d in floats)  # Adam's moments are float32 whatever the params
  new, _ = step(state)
  assert jax.tree.structure(new.opt_state) == jax.tree.structure(state.opt_state)
  assert dtypes(new.opt_state) == dtypes(state.opt_state)
  assert dtypes(new.params) == dtypes(state.params)
  step(new)
  assert step._cache_size() == 1  # the second step reuses the first one's compilation


def test_float32_params_get_float32_gradients_under_bfloat16_compute():
  model = M.Qwen25VL(CFG.replace(dtype=jnp.bfloat16), rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model)
  ids = jnp.arange(8, dtype=jnp.int32)[None]
  pos = jnp.broadcast_to(jnp.arange(8, dtype=jnp.int32), (3, 1, 8))

  def loss(p):
    m = nnx.merge(graphdef, p)
    hidden, _ = m.decode(m.embed(ids), pos, jnp.ones((1, 8), bool))
    return jnp.mean(m.logits(hidden))

  grads = jax.grad(loss)(params)
  assert {x.dtype for x in jax.tree.leaves(grads)} == {jnp.dtype(jnp.float32)}


def test_config_refuses_bfloat16_masters_with_round_to_nearest_updates():
  c = base_config()
  validate(c)
  c.model.param_dtype = "bfloat16"
  with pytest.raises(ValueError) as err:
    validate(c)
  msg = str(err.value)
  for phase in ("sft", "rl"):
    assert f"model.param_dtype='bfloat16' with {phase}.optim.master_update='exact'" in msg
    assert f"--config.{phase}.optim.master_update=stochastic_rounding" in msg
  assert "--config.model.param_dtype=float32" in msg
  c.sft.optim.master_update = "stochastic_rounding"
  c.rl.steps = 0  # a phase that does not train needs no choice
  validate(c)
  c.sft.optim.master_update = "nearest"
  with pytest.raises(ValueError, match="sft.optim.master_update='nearest': choose one of exact, stochastic_rounding"):
    validate(c)


def test_real_checkpoints_keep_float32_masters_and_compute_in_bfloat16():
  c = base_config()
  real_model_run(c, max_new_tokens=64)
  model = validate(c).model
  assert (model.param_dtype_name(), model.dtype) == ("float32", "bfloat16")  # 'auto' without LoRA: float32
  assert (c.sft.optim.master_update, c.rl.optim.master_update) == ("exact", "exact")
