"""The step guard (issue 30, case 1): a non-finite or diverged update is never applied and says which quantity went
wrong; a finite step is bit for bit the unguarded one; the host stops (or skips within its budget) naming the step
and the last good checkpoint, warns about a collapsed policy; metrics tell a non-finite value from one not measured;
validate() refuses non-finite numbers in the config."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxcap.models as M
from jaxcap.models.vision import vision_layout
from jaxcap.train.steps import guard
from jaxcap.config_files import validate
from jaxcap.train.steps.guard import HEALTH, NonFiniteError, StepGuard, step_health
from jaxcap.train.logs.metrics import MetricsWriter, PendingMetrics, read_metrics, to_json
from jaxcap.config.training import Optim
from jaxcap.train.steps.state import init_train_state, make_optimizer
from jaxcap.train.steps.accumulate import apply_update
from jaxcap.train.steps.updates import PromptBatch, sft_step
from processes import load_config

CFG = M.tiny()
B, P, C = 2, 10, 5


def _batch():
  rng = np.random.default_rng(0)
  ids = rng.integers(0, 400, (1, B, P)).astype(np.int32)
  ids[:, :, 1] = CFG.image_token_id
  pos = np.broadcast_to(np.arange(P), (1, 3, B, P)).astype(np.int32)
  pixels = rng.normal(size=(1, B * 4, CFG.vision.patch_dim)).astype(np.float32)
  prompts = PromptBatch(ids, pos, np.ones((1, B, P), bool), pixels)
  targets = rng.integers(0, 400, (1, B, C)).astype(np.int32)
  return prompts, targets, np.ones((1, B, C), bool), vision_layout(np.array([[1, 2, 2]] * B), CFG.vision)


def _run(lr, max_update_ratio=1.0):
  """(state before, state after, metrics) of one jitted SFT step (the state before copied out of the donation)."""
  graphdef, params = nnx.split(M.Qwen25VL(CFG, rngs=nnx.Rngs(0)))
  opt = make_optimizer(Optim(lr, schedule="constant", grad_clip=1.0), 10)
  state = init_train_state(params, opt, jax.random.key(0))
  before = _host(state)
  step = jax.jit(lambda s, *a: sft_step(s, *a, graphdef=graphdef, optimizer=opt, max_update_ratio=max_update_ratio))
  after, metrics = step(state, *_batch())
  return before, _host(after), jax.device_get(metrics)


def _host(state):
  """A numpy copy of a train state (its PRNG key as key data)."""
  key = lambda x: jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x
  return jax.tree.map(lambda x: np.array(key(x)), state)


def _same(a, b) -> bool:
  return all(np.array_equal(x, y, equal_nan=True) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_health_code_names_the_first_bad_quantity():
  params = {"w": jnp.ones((4,))}  # norm 2
  cases = [
    ((1.0, 1.0, 1.0), 0),
    ((jnp.nan, jnp.inf, jnp.nan), 1),  # the loss first
    ((1.0, jnp.inf, jnp.nan), 2),
    ((1.0, 1.0, jnp.nan), 3),
    ((1.0, 1.0, 2.01), 4),  # update norm > 1.0 x params norm 2
    ((1.0, 1.0, 2.0), 0),
  ]
  for (loss, g, u), code in cases:
    assert int(step_health(jnp.float32(loss), jnp.float32(g), jnp.float32(u), params, 1.0)) == code, (loss, g, u)
  assert int(step_health(jnp.float32(1), jnp.float32(1), jnp.float32(1e9), params, 0.0)) == 0  # ratio check off


@pytest.mark.slow
def test_infinite_learning_rate_step_is_not_applied():
  before, after, metrics = _run(jnp.inf)
  assert int(metrics[HEALTH]) == 3 and guard.QUANTITIES[3] == "update"
  assert math.isfinite(float(metrics["loss"])) and not math.isfinite(float(metrics["update_norm"]))
  assert _same(before.params, after.params) and _same(before.opt_state, after.opt_state)
  assert int(after.step) == int(before.step) + 1  # the data position moves on with the step counter


def _toy(lr, grads=(0.5, -0.25, 1.0, 2.0), loss=1.0, max_update_ratio=1.0):
  """(state before, after, metrics) of the guarded optimizer update (`accumulate.apply_update`) on a 4-weight toy model."""
  opt = make_optimizer(Optim(lr, schedule="constant", grad_clip=1.0), 10)
  state = init_train_state({"w": jnp.full((4,), 0.1)}, opt, jax.random.key(0))
  g = {"w": jnp.asarray(grads, jnp.float32)}
  after, metrics = jax.jit(lambda s, g, x: apply_update(s, g, opt, "exact", x, max_update_ratio))(
    state, g, jnp.float32(loss)
  )
  return _host(state), _host(after), jax.device_get(metrics)


@pytest.mark.parametrize(
  "kw, code",
  [
    ({"loss": float("nan")}, 1),
    ({"grads": (0.5, float("nan"), 1.0, 2.0)}, 2),
    ({"lr": float("inf")}, 3),
    ({"lr": 1e3}, 4),  # the lr=1e3: a first update of 1e3 per weight on weights of 0.1
  ],
)
def test_bad_step_keeps_params_and_optimizer_state_and_names_the_quantity(kw, code):
  before, after, metrics = _toy(**{"lr": 1e-3, **kw})
  assert int(metrics[HEALTH]) == code
  assert _same(before.params, after.params) and _same(before.opt_state, after.opt_state)
  assert int(after.step) == int(before.step) + 1


def test_divergence_check_is_off_at_ratio_zero_and_a_sane_step_applies():
  before, after, metrics = _toy(1e3, max_update_ratio=0.0)
  assert int(metrics[HEALTH]) == 0 and not _same(before.params, after.params)
  before, after, metrics = _toy(1e-3)
  assert int(metrics[HEALTH]) == 0
  np.testing.assert_allclose(after.params["w"], 0.1 - 1e-3 * np.sign([0.5, -0.25, 1.0, 2.0]), rtol=1e-4)


@pytest.mark.slow
def test_finite_step_is_bitwise_the_unguarded_step(monkeypatch):
  _, guarded, metrics = _run(1e-2)
  assert int(metrics[HEALTH]) == 0
  monkeypatch.setattr(guard, "keep_if", lambda ok, new, old: new)  # the step as it was before the guard
  _, unguarded, plain = _run(1e-2)
  assert _same(guarded, unguarded)
  assert all(np.array_equal(metrics[k], plain[k]) for k in plain)


def _guard(**kw):
  warnings = []
  g = StepGuard(last_checkpoint=lambda: "/w/checkpoints/3", warn=warnings.append, **kw)
  return g, warnings


def test_refused_step_stops_the_run_naming_step_quantity_and_checkpoint():
  g, _ = _guard()
  row, error = g.check("sft", 4, {"loss": "nan", "grad_norm": 1.0, HEALTH: 1})
  assert row == {"loss": "nan", "grad_norm": 1.0, "skipped": "loss"}
  assert isinstance(error, NonFiniteError)
  assert (error.phase, error.step, error.quantity, error.checkpoint) == ("sft", 4, "loss", "/w/checkpoints/3")
  assert str(error).startswith("sft step 4: non-finite loss; the step was not applied")
  assert "the last good checkpoint is /w/checkpoints/3" in str(error) and "--config.resume_changes=allow" in str(error)
  _, error = StepGuard().check("rl", 1, {HEALTH: 4})
  assert "diverged" in str(error) and "no checkpoint was saved" in str(error)


def test_skip_mode_skips_up_to_its_budget_of_consecutive_steps():
  g, warnings = _guard(on_nonfinite="skip", max_skips=2)
  outcomes = [g.check("rl", s, {HEALTH: h})[1] for s, h in [(1, 2), (2, 2), (3, 0), (4, 3), (5, 3)]]
  assert outcomes == [None] * 5 and len(warnings) == 4  # a good step resets the count
  _, error = g.check("rl", 6, {HEALTH: 3})
  assert (error.step, error.quantity) == (6, "update") and "after 2 skipped steps in a row" in str(error)


def test_collapse_is_warned_once_after_k_flat_steps():
  g, warnings = _guard(collapse_steps=3, max_entropy=math.log(512))
  for step in range(1, 6):
    g.check("rl", step, {"grad_norm": 0.0, "entropy": math.log(512) - 1e-4, HEALTH: 0})
  assert len(warnings) == 2  # grad norm and entropy, each once, at step 3
  assert all(w.startswith("warning: rl step 3: ") and "3 steps in a row" in w for w in warnings)
  g, warnings = _guard(collapse_steps=3, max_entropy=math.log(512))
  for step, norm in enumerate([0.0, 0.0, 0.5, 0.0, 0.0], 1):  # interrupted: never 3 in a row
    g.check("sft", step, {"grad_norm": norm, HEALTH: 0})
  assert warnings == []


def test_metrics_keep_non_finite_apart_from_not_measured(tmp_path):
  device = {"loss": jnp.float32(jnp.nan), "grad_norm": jnp.float32(jnp.inf), "update_norm": jnp.float32(-jnp.inf)}
  row = PendingMetrics(device, {"reward/caprl": float("nan"), "reward/mean": 0.5}).result()
  writer = MetricsWriter(tmp_path)
  writer.write("rl", 1, row)
  writer.close()
  [record] = read_metrics(tmp_path / "metrics.jsonl")
  assert record == {
    "phase": "rl",
    "step": 1,
    "loss": "nan",
    "grad_norm": "inf",
    "update_norm": "-inf",
    "reward/caprl": None,  # nobody measured it
    "reward/mean": 0.5,
  }
  assert math.isinf(float(record["grad_norm"]))
  assert json.loads(to_json({"x": float("nan")})) == {"x": None}


@pytest.mark.parametrize(
  "overrides, error",
  [
    ({"rl.optim.lr": float("inf")}, "rl.optim.lr=inf: must be a finite number"),
    ({"sft.optim.lr": float("nan")}, "sft.optim.lr=nan: must be a finite number"),
    ({"sampling.temperature": float("inf")}, "sampling.temperature=inf: must be a finite number"),
    ({"reward.caprl.weight": float("-inf")}, "reward.caprl.weight=-inf: must be a finite number"),
    ({"train.on_nonfinite": "ignore"}, "train.on_nonfinite='ignore': use stop or skip"),
  ],
)
def test_validate_refuses_non_finite_numbers_naming_the_field(overrides, error):
  with pytest.raises(ValueError) as e:
    validate(load_config("caprl", **overrides))
  assert str(e.value) == f"invalid config:\n  - {error}"
