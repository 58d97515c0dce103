"""The pure update steps: micro-batching does not change the update, and SFT on a fixed batch learns."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxcap.models as M
from jaxcap.models.vision import vision_layout
from jaxcap.config.training import Optim
from jaxcap.train.steps.state import init_train_state, make_optimizer
from jaxcap.train.steps.updates import PromptBatch, RolloutBatch, rl_step, sequence_logprobs, sft_step
from loss_configs import plain_loss

CFG = M.tiny()
B, P, C, G = 4, 12, 6, 2


def _prompts(num_micro, rng):
  """B prompts of P tokens with one 28x28 image (1 merged token) each, left-padded by varying amounts."""
  ids = rng.integers(0, 400, (B, P)).astype(np.int32)
  mask = np.ones((B, P), bool)
  for b in range(B):
    mask[b, :b] = False  # left padding
    ids[b, b + 1] = CFG.image_token_id
  pos = np.broadcast_to(np.cumsum(mask, 1) - 1, (3, B, P)).astype(np.int32)
  grid = np.array([[1, 2, 2]] * B)
  pixels = rng.normal(size=(B * 4, CFG.vision.patch_dim)).astype(np.float32)
  m = num_micro
  return (
    PromptBatch(
      ids.reshape(m, B // m, P),
      pos.reshape(3, m, B // m, P).transpose(1, 0, 2, 3),
      mask.reshape(m, B // m, P),
      pixels.reshape(m, -1, CFG.vision.patch_dim),
    ),
    vision_layout(grid[: B // m], CFG.vision),
  )


def _state(lr=1e-2):
  model = M.Qwen25VL(CFG, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model)
  opt = make_optimizer(Optim(lr, grad_clip=0.0), 100)
  return graphdef, opt, init_train_state(params, opt, jax.random.key(0))


def _targets(rng, num_micro):
  t = rng.integers(0, 400, (B, C)).astype(np.int32)
  mask = np.ones((B, C), bool)
  mask[0, 3:] = False  # uneven token counts across micro-batches
  mask[3, 1:] = False
  return t.reshape(num_micro, B // num_micro, C), mask.reshape(num_micro, B // num_micro, C)


@pytest.mark.slow
def test_sft_update_is_independent_of_micro_batching():
  results = []
  for m in (1, 2, 4):
    rng = np.random.default_rng(0)
    prompts, layout = _prompts(m, rng)
    t, mask = _targets(rng, m)
    graphdef, opt, state = _state()
    new, metrics = jax.jit(lambda s: sft_step(s, prompts, t, mask, layout, graphdef=graphdef, optimizer=opt))(state)
    results.append((float(metrics["loss"]), float(metrics["grad_norm"]), new.params))
  for loss, grad_norm, params in results[1:]:
    # The loss and gradient are token-weighted over the whole batch, whatever the micro-batching.
    np.testing.assert_allclose(loss, results[0][0], rtol=1e-5)
    np.testing.assert_allclose(grad_norm, results[0][1], rtol=1e-4)
    # Adam's first step is ~lr * sign(g), so near-zero gradients amplify float noise; compare on average.
    assert jax.tree.structure(params) == jax.tree.structure(results[0][2])
    diffs = jax.tree.map(lambda a, b: np.abs(np.asarray(a) - np.asarray(b)).ravel(), params, results[0][2])
    diffs = np.concatenate(jax.tree.leaves(diffs))
    assert diffs.mean() < 1e-6, diffs.mean()


@pytest.mark.slow
def test_sft_overfits_a_fixed_batch():
  rng = np.random.default_rng(1)
  prompts, layout = _prompts(2, rng)
  t, mask = _targets(rng, 2)
  graphdef, opt, state = _state(lr=3e-3)
  step = jax.jit(lambda s: sft_step(s, prompts, t, mask, layout, graphdef=graphdef, optimizer=opt))
  losses = []
  for _ in range(30):
    state, metrics = step(state)
    losses.append(float(metrics["loss"]))
  assert losses[-1] < 0.2 * losses[0], losses


def test_a_frozen_vision_tower_keeps_its_parameters_while_the_decoder_learns():
  rng = np.random.default_rng(2)
  prompts, layout = _prompts(1, rng)
  t, mask = _targets(rng, 1)
  graphdef, _, state = _state()
  opt = make_optimizer(Optim(1e-2), 100, frozen=("visual",))
  state = init_train_state(state.params, opt, jax.random.key(0))
  new, _ = jax.jit(lambda s: sft_step(s, prompts, t, mask, layout, graphdef=graphdef, optimizer=opt))(state)
  assert jax.tree.structure(new.params) == jax.tree.structure(state.params)
  for name in state.params.keys():
    moved = jax.tree.leaves(jax.tree.map(lambda a, b: not np.array_equal(a, b), state.params[name], new.params[name]))
    assert moved and ((not any(moved)) if name == "visual" else all(moved)), name


@pytest.mark.slow
def test_rl_step_raises_the_probability_of_advantaged_completions():
  rng = np.random.default_rng(2)
  prompts, layout = _prompts(2, rng)
  graphdef, opt, state = _state(lr=3e-3)
  tokens = rng.integers(0, 400, (2, B // 2 * G, C)).astype(np.int32)
  mask = np.ones(tokens.shape, bool)
  old = sequence_logprobs(graphdef, state.params, prompts, layout, jnp.asarray(tokens))
  rewards = np.zeros((2, B // 2, G, 1), np.float32)
  rewards[:, :, 0] = 1.0  # sample 0 of every prompt is the good one
  batch = RolloutBatch(
    jnp.asarray(tokens),
    jnp.asarray(mask),
    old,
    jnp.asarray(rewards),
    jnp.ones(rewards.shape, bool),
    jnp.ones((1,), jnp.float32),
  )
  step = jax.jit(
    lambda s, b: rl_step(
      s, prompts, b, layout, graphdef=graphdef, optimizer=opt, loss_config=plain_loss(), estimator="grpo"
    )
  )
  new, metrics = step(state, batch)
  after = sequence_logprobs(graphdef, new.params, prompts, layout, jnp.asarray(tokens))
  delta = np.asarray((after - old).sum(-1)).reshape(2, B // 2, G)
  assert (delta[:, :, 0] > delta[:, :, 1]).all(), delta
  assert np.isfinite(float(metrics["loss"]))
