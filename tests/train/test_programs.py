"""One program builder: `jaxcap.plan` compiles the RL step the trainer runs, for the same config (equal lowered
StableHLO), and the builder's optimizer carries every field of the config's optim block."""

import types

import jax
import numpy as np
import pytest
from flax import nnx

from jaxcap.config import schema
from jaxcap.models.qwen25vl_presets import tiny
from jaxcap.models.qwen25vl import Qwen25VL
from jaxcap.plan import plan, program_fingerprint, rl_step_inputs
from jaxcap.sharding import make_mesh
from jaxcap.train.shell.phases import RLPhase
from jaxcap.train.steps.programs import RunPrograms, phase_optimizer
from processes import load_config


def _config(spec: str, **overrides):
  c = load_config(spec, **overrides)
  # tiny shapes: 2 prompts x G 2, one micro-batch, 8 new tokens, one 56 px image per prompt
  c.rl.update(dict(batch_size=2, num_samples=2, micro_batches=1))
  c.sampling.max_new_tokens = 8
  c.data.update(dict(image_size=56, max_pixels=0))
  return c


def _trainer_step_fingerprint(config, cfg, devices) -> str:
  """The RL step as the trainer builds it (`RLPhase.new_state` + `step_fn` on its RunPrograms), lowered for the
  plan's argument shapes."""
  mesh = make_mesh(dict(config.mesh.shape), devices=devices)
  with jax.set_mesh(mesh):
    model = Qwen25VL(cfg, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model)
  trainer = types.SimpleNamespace(
    config=config, programs=RunPrograms(config, graphdef), setup=types.SimpleNamespace(mesh=mesh)
  )
  phase = RLPhase("rl", 1, config.rl.steps, config.rl.batch_size, config.sft.steps, update=None)
  state = phase.new_state(trainer, params, jax.random.key(0))
  step_fn = phase.step_fn(trainer, state)
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), params)
  inputs = rl_step_inputs(config, cfg, mesh, abstract, phase.optimizer, text=8)
  with jax.set_mesh(mesh):
    return program_fingerprint(step_fn.lower(state, inputs.prompts, inputs.rollouts, inputs.layout))


# A non-default policy loss with rollout correction: the step then also takes the sampler's log-probs, which the
# plan's abstract inputs must match. One case: the other losses and corrections change the program's body only
# (compiled and run in tests/train/test_rl_step_options.py), not its arguments.
GSPO_TOKEN_TIS_MIS = {
  "rl.loss.policy": "gspo",
  "rl.rollout_correction.is_level": "token",
  "rl.rollout_correction.reject": "token_k1",  # masked IS: tokens whose ratio leaves [1/2, 2] are masked out
}


@pytest.mark.slow
@pytest.mark.parametrize(
  "spec, overrides",
  [
    ("configs/caprl.py", {}),
    ("configs/caprl.py:paper", {}),
    ("configs/caprl.py", GSPO_TOKEN_TIS_MIS),
  ],
  ids=["caprl", "caprl_paper", "gspo_token_tis_mis"],
)
def test_plan_compiles_the_trainers_rl_step(spec, overrides):
  config = _config(spec, **overrides)
  model = schema.parse(config).model  # the typed block: its dtype rule ('auto')
  precision = dict(dtype=jax.numpy.dtype(model.dtype), param_dtype=jax.numpy.dtype(model.param_dtype_name()))
  cfg = tiny(remat=config.model.remat, scan_layers=config.model.scan_layers, **precision)
  devices = jax.devices()[:2]
  planned = plan(config, cfg, devices, hbm_gib=80.0, names=("rl_step",), text=8)
  (step,) = planned["programs"]
  assert len(step["fingerprint"]) == 64
  assert step["fingerprint"] == _trainer_step_fingerprint(config, cfg, devices)


@pytest.mark.slow
def test_fingerprints_tell_programs_apart():
  config = _config("configs/caprl.py")
  cfg = tiny()
  devices = jax.devices()[:2]
  base = plan(config, cfg, devices, 80.0, ("rl_step",), text=8)["programs"][0]["fingerprint"]
  config.rl.loss.eps_high = 0.4  # a different clip range is a different program
  assert plan(config, cfg, devices, 80.0, ("rl_step",), text=8)["programs"][0]["fingerprint"] != base


def test_phase_optimizer_reads_every_adam_field():
  c = _config("configs/caprl.py")
  c.rl.optim.warmup_steps = 0
  params = {"w": np.ones((2, 2), np.float32)}
  grads = [{"w": np.full((2, 2), 1e-3, np.float32)}, {"w": np.full((2, 2), -3e-3, np.float32)}]

  def second_update(**optim):
    # Adam's first step is g / (|g| + eps) whatever b1 and b2: the second one depends on both
    c.rl.optim.update(dict(b1=0.9, b2=0.999, eps=1e-8) | optim)
    opt = phase_optimizer(c, "rl", steps=10)
    state = opt.init(params)
    for g in grads:
      updates, state = opt.update(g, state, params)
    return np.asarray(updates["w"])

  base = second_update()
  for field, value in (("b1", 0.5), ("b2", 0.5), ("eps", 1e-2)):
    assert not np.allclose(base, second_update(**{field: value})), f"rl.optim.{field} does not reach the optimizer"
