"""The prompt-shared training passes (`model.share_prompt`, `jaxcap.models.shared_decode`) equal the repeated ones:
log-probs, entropies and gradients for every family (Qwen3-VL's DeepStack at the prompt, Qwen3.5's linear layers
continuing from the prompt's state), with LoRA, under a
sharded mesh; and the whole RL step (every loss aggregation, KL, rollout correction, micro-batch splits)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxcap.models as M
from jaxcap.models import lora
from jaxcap.models.families import layout_for
from jaxcap.models.qwen25vl import VisionInput
from jaxcap.rl.rollout_correction import RolloutCorrectionConfig
from jaxcap.sharding import make_mesh, param_shardings
from jaxcap.train.steps.logprobs import completion_logprobs
from jaxcap.train.steps.updates import PromptBatch, RolloutBatch, rl_step, sequence_logprobs
from jaxcap.train.steps.state import init_train_state, make_optimizer
from jaxcap.config.training import Optim
from loss_configs import plain_loss

B, P, C, G = 4, 14, 7, 3


def _prompts(cfg, rng, num_micro=1):
  """B prompts of P tokens, left-padded by 0..B-1, each with one image of 2 x 2 merged tokens (4 x 4 patches)."""
  ids = rng.integers(0, 400, (B, P)).astype(np.int32)
  mask = np.ones((B, P), bool)
  for b in range(B):
    mask[b, :b] = False
    ids[b, b + 1 : b + 5] = cfg.image_token_id
  pos = np.broadcast_to(np.cumsum(mask, 1) - 1, (3, B, P)).astype(np.int32)
  grid = np.array([[1, 4, 4]] * (B // num_micro))
  pixels = rng.normal(size=(B * 16, cfg.vision.patch_dim)).astype(np.float32)
  m = num_micro
  prompts = PromptBatch(
    ids.reshape(m, B // m, P),
    pos.reshape(3, m, B // m, P).transpose(1, 0, 2, 3),
    mask.reshape(m, B // m, P),
    pixels.reshape(m, -1, cfg.vision.patch_dim),
  )
  return prompts, layout_for(grid, cfg.vision)


def _pair(family, **overrides):
  """Two graphdefs of one model, sharing and repeating the prompt, and its params."""
  from jaxcap.models.families import family as family_named

  make, cfg = family_named(family).model_cls, family_named(family).presets["tiny"]()
  cfg = cfg.replace(**overrides)
  model = make(cfg.replace(share_prompt=True), rngs=nnx.Rngs(0))
  if family == "qwen3_vl":
    assert cfg.vision.deepstack_visual_indexes, "the test needs DeepStack features"
  shared, params = nnx.split(model)
  repeated, _ = nnx.split(make(cfg.replace(share_prompt=False), rngs=nnx.Rngs(0)))
  return cfg, shared, repeated, params


def _objective(graphdef, params, prompts, layout, tokens, weights):
  """A scalar reading every log-prob and entropy, and both."""
  model = nnx.merge(graphdef, params)
  pb = jax.tree.map(lambda x: x[0], prompts)
  lp, ent = completion_logprobs(
    model, pb.ids, pb.positions, pb.mask, VisionInput(pb.pixel_values, layout), tokens, with_entropy=True
  )
  return jnp.sum(lp * weights) + 0.1 * jnp.sum(ent * weights), (lp, ent)


def _close(got, want, atol):
  for path, a, b in zip(jax.tree.leaves_with_path(got), jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(
      np.asarray(a), np.asarray(b), atol=atol, rtol=1e-4, err_msg=jax.tree_util.keystr(path[0])
    )


def _check_equal(graphdefs, params, prompts, layout, rng, vocab, atol=2e-5):
  tokens = jnp.asarray(rng.integers(0, vocab, (B * G, C)).astype(np.int32))
  weights = jnp.asarray(rng.normal(size=(B * G, C)).astype(np.float32))
  outs = [
    jax.jit(jax.value_and_grad(lambda p, g=g: _objective(g, p, prompts, layout, tokens, weights), has_aux=True))(params)
    for g in graphdefs
  ]
  (v_shared, (lp_shared, ent_shared)), g_shared = outs[0]
  (v_rep, (lp_rep, ent_rep)), g_rep = outs[1]
  np.testing.assert_allclose(np.asarray(lp_shared), np.asarray(lp_rep), atol=atol)
  np.testing.assert_allclose(np.asarray(ent_shared), np.asarray(ent_rep), atol=atol)
  assert jax.tree.structure(g_shared) == jax.tree.structure(g_rep)
  _close(g_shared, g_rep, atol=1e-4)
  assert sum(float(jnp.abs(x).sum()) for x in jax.tree.leaves(g_shared)) > 0
  return g_shared


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl", "qwen3_5"])
def test_shared_prompt_logprobs_and_gradients_equal_the_repeated_pass(family):
  cfg, shared, repeated, params = _pair(family)
  rng = np.random.default_rng(0)
  prompts, layout = _prompts(cfg, rng)
  grads = _check_equal((shared, repeated), params, prompts, layout, rng, cfg.text.vocab_size)
  # the vision tower's gradient reaches it through the shared prompt (once, summed over the group)
  assert float(jnp.abs(jax.tree.leaves(grads["visual"])[0]).sum()) > 0
  # and the shared pass does less work: B x P + N x C decoder positions instead of N x (P + C)
  tokens, weights = jnp.zeros((B * G, C), jnp.int32), jnp.zeros((B * G, C))
  flops = [
    jax.jit(lambda p, g=g: _objective(g, p, prompts, layout, tokens, weights)[0])
    .lower(params)
    .compile()
    .cost_analysis()["flops"]
    for g in (shared, repeated)
  ]
  assert flops[0] < 0.8 * flops[1], flops


def test_shared_prompt_with_lora_adapters():
  cfg, shared, repeated, params = _pair("qwen2_5_vl")
  model = lora.apply_lora(nnx.merge(shared, params), rank=4, alpha=8.0, seed=1)
  # adapters start at B = 0; move them so their gradients differ from the base's path
  adapters = nnx.state(model, nnx.LoRAParam)
  nnx.update(model, jax.tree.map(lambda x: x + 0.01, adapters))  # B starts at 0: give the adapters an effect
  shared, params = nnx.split(model)
  repeated, _ = nnx.split(
    lora.apply_lora(M.Qwen25VL(cfg.replace(share_prompt=False), rngs=nnx.Rngs(0)), rank=4, alpha=8.0, seed=1)
  )
  rng = np.random.default_rng(1)
  prompts, layout = _prompts(cfg, rng)
  _check_equal((shared, repeated), params, prompts, layout, rng, cfg.text.vocab_size)


def test_shared_prompt_under_a_sharded_mesh():
  """On 8 devices (data 2, fsdp 2, tensor 2), the shared pass equals the repeated one run unsharded."""
  cfg, shared, repeated, params = _pair("qwen2_5_vl")
  rng = np.random.default_rng(2)
  prompts, layout = _prompts(cfg, rng)
  tokens = jnp.asarray(rng.integers(0, cfg.text.vocab_size, (B * G, C)).astype(np.int32))
  weights = jnp.asarray(rng.normal(size=(B * G, C)).astype(np.float32))
  f = lambda g: jax.jit(jax.value_and_grad(lambda p: _objective(g, p, prompts, layout, tokens, weights), has_aux=True))
  (_, (want, _)), want_grads = f(repeated)(params)
  mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  with jax.set_mesh(mesh):
    placed = jax.device_put(params, param_shardings(params, mesh))
    (_, (got, _)), grads = f(shared)(placed)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5)
  _close(grads, want_grads, atol=1e-4)


LOSSES = [
  pytest.param(dict(aggregation="token-mean"), id="token-mean"),
  pytest.param(dict(aggregation="seq-mean-token-mean"), id="seq-mean-token-mean"),
  pytest.param(dict(aggregation="seq-mean-token-sum"), id="seq-mean-token-sum"),
  pytest.param(dict(aggregation="seq-mean-token-sum-norm", max_gen_len=C), id="seq-mean-token-sum-norm"),
  pytest.param(dict(kl_coef=0.1, entropy_coef=0.01), id="kl+entropy"),
]


@pytest.mark.slow
@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("num_micro", [1, 2])
def test_rl_step_equals_the_repeated_step(loss, num_micro):
  """The whole update (advantages, loss, micro-batch accumulation, the optimizer step) with the prompt shared
  equals it repeated: loss, metrics, and the gradient (an SGD step of lr 1 moves the params by it)."""
  cfg, shared, repeated, params = _pair("qwen2_5_vl")
  rng = np.random.default_rng(3)
  prompts, layout = _prompts(cfg, rng, num_micro)
  m = num_micro
  tokens = jnp.asarray(rng.integers(0, 400, (m, B // m * G, C)).astype(np.int32))
  mask = np.ones(tokens.shape, bool)
  mask[..., 0, 4:] = False  # a short completion in every micro-batch
  old = sequence_logprobs(repeated, params, prompts, layout, tokens)
  ref = old + jnp.asarray(rng.normal(scale=0.05, size=old.shape).astype(np.float32))
  rewards = rng.normal(size=(m, B // m, G, 1)).astype(np.float32)
  batch = RolloutBatch(
    tokens,
    jnp.asarray(mask),
    old,
    jnp.asarray(rewards),
    jnp.ones(rewards.shape, bool),
    jnp.ones((1,)),
    ref_logprobs=ref,
    behaviour_logprobs=old + 0.02,
  )
  correction = RolloutCorrectionConfig(is_level="token", is_threshold=2.0)
  opt = make_optimizer(Optim(1.0, grad_clip=0.0, b1=0.0, b2=0.0, eps=1.0), 10)  # ~ SGD: the step is g / (|g| + 1)
  state = init_train_state(params, opt, jax.random.key(0))
  outs = []
  for graphdef in (shared, repeated):
    step = jax.jit(
      lambda s, g=graphdef: rl_step(
        s, prompts, batch, layout, graphdef=g, optimizer=opt, loss_config=plain_loss(**loss), correction=correction
      )
    )
    outs.append(step(state))
  (new_s, metrics_s), (new_r, metrics_r) = outs
  assert set(metrics_s) == set(metrics_r)
  for k in metrics_s:
    np.testing.assert_allclose(np.asarray(metrics_s[k]), np.asarray(metrics_r[k]), rtol=2e-4, atol=2e-6, err_msg=k)
  _close(new_s.params, new_r.params, atol=2e-5)
