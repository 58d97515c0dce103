"""rl_step's options: rollout correction with identical log-probs is a no-op, mask_truncated removes the gradient of
truncated rollouts (and is a no-op without any), and the other policy losses also move probability towards the
advantaged completions."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcap.rl.rollout_correction import RolloutCorrectionConfig
from jaxcap.train.steps.updates import RolloutBatch, rl_step, sequence_logprobs
from tests.train.test_train_step import B, C, G, _prompts, _state
from loss_configs import plain_loss

pytestmark = pytest.mark.slow  # seven compiles of the full RL step; the loss formulas are tested in tests/rl


def _setup():
  rng = np.random.default_rng(2)
  prompts, layout = _prompts(2, rng)
  graphdef, opt, state = _state(lr=3e-3)
  tokens = jnp.asarray(rng.integers(0, 400, (2, B // 2 * G, C)).astype(np.int32))
  old = sequence_logprobs(graphdef, state.params, prompts, layout, tokens)
  rewards = np.zeros((2, B // 2, G, 1), np.float32)
  rewards[:, :, 0] = 1.0  # sample 0 of every prompt is the good one
  batch = RolloutBatch(
    tokens, jnp.ones(tokens.shape, bool), old, jnp.asarray(rewards), jnp.ones(rewards.shape, bool), jnp.ones((1,))
  )
  return prompts, layout, graphdef, opt, state, batch


def _run(setup, batch=None, **kw):
  prompts, layout, graphdef, opt, state, default = setup
  kw.setdefault("loss_config", plain_loss())
  step = jax.jit(lambda s, b: rl_step(s, prompts, b, layout, graphdef=graphdef, optimizer=opt, **kw))
  return step(state, default if batch is None else batch)


@pytest.fixture(scope="module")
def setup():
  return _setup()


@pytest.fixture(scope="module")
def plain(setup):
  return _run(setup)


def _same(a, b):
  for x, y in zip(jax.tree.leaves(a[0].params), jax.tree.leaves(b[0].params)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  np.testing.assert_array_equal(float(a[1]["loss"]), float(b[1]["loss"]))


def test_correction_with_identical_log_probs_is_a_no_op(setup, plain):
  batch = setup[-1]
  batch = dataclasses.replace(batch, behaviour_logprobs=batch.old_logprobs)
  config = RolloutCorrectionConfig(is_level="sequence", reject="seq_max_k3", reject_upper=1e-3)
  out = _run(setup, batch, correction=config)
  _same(out, plain)
  assert float(out[1]["rollout_corr/is_max"]) == 1.0 and float(out[1]["rollout_corr/reject_seq_frac"]) == 0.0


def test_mask_truncated(setup, plain):
  batch = setup[-1]
  none = dataclasses.replace(batch, truncated=jnp.zeros(batch.tokens.shape[:2], bool))
  _same(_run(setup, none, mask_truncated=True), plain)
  every = dataclasses.replace(batch, truncated=jnp.ones(batch.tokens.shape[:2], bool))
  state, metrics = _run(setup, every, mask_truncated=True)
  assert float(metrics["grad_norm"]) == 0.0
  assert float(metrics["truncated/frac"]) == 1.0 and float(metrics["truncated/masked_frac"]) == 1.0
  with pytest.raises(ValueError, match="rollouts.truncated"):
    _run(setup, batch, mask_truncated=True)


@pytest.mark.parametrize("policy", ["gspo", "cispo", "clip_cov"])
def test_other_losses_raise_the_probability_of_advantaged_completions(setup, policy):
  prompts, layout, graphdef, _, _, batch = setup
  new, metrics = _run(setup, loss_config=plain_loss(policy=policy, clip_cov_ratio=0.2))
  after = sequence_logprobs(graphdef, new.params, prompts, layout, batch.tokens)
  delta = np.asarray((after - batch.old_logprobs).sum(-1)).reshape(2, B // 2, G)
  assert (delta[:, :, 0] > delta[:, :, 1]).all(), delta
  assert np.isfinite(float(metrics["loss"]))
