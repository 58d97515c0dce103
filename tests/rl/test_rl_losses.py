"""Policy loss: hand-computed aggregation and clipping, analytic gradients, KL estimators, degenerate inputs."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcap import rl
from loss_configs import plain_loss

TOKEN_LOSS = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]], np.float32)
TOKEN_MASK = np.array([[1, 1, 0], [1, 0, 0], [0, 0, 0]], np.float32)  # the third sequence is empty


@pytest.mark.parametrize(
  "mode, max_gen_len, expected",
  [
    ("token-mean", None, (1 + 2 + 4) / 3),
    ("seq-mean-token-sum", None, (3 + 4) / 2),
    ("seq-mean-token-mean", None, (1.5 + 4) / 2),
    ("seq-mean-token-sum-norm", None, (3 + 4) / (2 * 3)),
    ("seq-mean-token-sum-norm", 8, (3 + 4) / (2 * 8)),
  ],
)
def test_aggregation_hand_computed(mode, max_gen_len, expected):
  got = rl.aggregate_loss(jnp.asarray(TOKEN_LOSS), jnp.asarray(TOKEN_MASK), mode, max_gen_len)
  np.testing.assert_allclose(got, expected, rtol=1e-6)


@pytest.mark.parametrize("mode", rl.LOSS_AGGREGATIONS)
def test_aggregation_of_empty_mask_is_zero(mode):
  assert float(rl.aggregate_loss(jnp.asarray(TOKEN_LOSS), jnp.zeros((3, 3)), mode)) == 0.0


def test_unknown_aggregation_and_bad_config_raise():
  with pytest.raises(ValueError):
    rl.aggregate_loss(jnp.asarray(TOKEN_LOSS), jnp.asarray(TOKEN_MASK), "sum")
  for bad in [
    dict(aggregation="sum"),
    dict(kl_estimator="k4"),
    dict(dual_clip_c=0.5),
    dict(eps_low=-0.1),
    dict(max_gen_len=0),
  ]:
    with pytest.raises(ValueError):
      rl.PolicyLossConfig(**bad)
  with pytest.raises(dataclasses.FrozenInstanceError):
    rl.PolicyLossConfig().eps_low = 0.3


# One token per sequence; ratios chosen to land in each region of the clipped objective.
#   seq  A    ratio  unclipped  clipped(eps .2/.28)  max   dual-clip(c=3)
#   0   +1    1.5    -1.5       -1.28                -1.28
#   1   +1    0.5    -0.5       -0.8                 -0.5
#   2   -1    0.5     0.5        0.8                  0.8
#   3   -1    5.0     5.0        1.28                 5.0   min(5, 3) = 3
#   4   -2    1.1     2.2        2.2                  2.2
RATIOS = np.array([1.5, 0.5, 0.5, 5.0, 1.1], np.float32)
ADVS = np.array([1.0, 1.0, -1.0, -1.0, -2.0], np.float32)
EXPECTED_TOKEN_LOSS = np.array([-1.28, -0.5, 0.8, 3.0, 2.2])


def _region_inputs():
  old = np.full((5, 1), -1.0, np.float32)
  new = old + np.log(RATIOS)[:, None]
  return jnp.asarray(new), jnp.asarray(old), jnp.asarray(ADVS), jnp.ones((5, 1))


def test_ppo_clip_higher_and_dual_clip_hand_computed():
  config = plain_loss(eps_low=0.2, eps_high=0.28, dual_clip_c=3.0)
  loss, metrics = rl.policy_loss(*_region_inputs(), config)
  np.testing.assert_allclose(loss, EXPECTED_TOKEN_LOSS.mean(), rtol=1e-5)
  # Clipped term active on seqs 0 (high), 2 (low), 3 (high ratio, negative advantage -> dual clip instead).
  np.testing.assert_allclose(metrics["clip_frac"], 2 / 5)
  np.testing.assert_allclose(metrics["clip_frac_high"], 1 / 5)
  np.testing.assert_allclose(metrics["clip_frac_low"], 1 / 5)
  np.testing.assert_allclose(metrics["dual_clip_frac"], 1 / 5)
  np.testing.assert_allclose(metrics["ratio_mean"], RATIOS.mean(), rtol=1e-5)
  k3 = RATIOS - 1 - np.log(RATIOS)
  np.testing.assert_allclose(metrics["approx_kl"], k3.mean(), rtol=1e-5)
  without_dual = rl.policy_loss(*_region_inputs(), dataclasses.replace(config, dual_clip_c=None))[0]
  np.testing.assert_allclose(without_dual, (EXPECTED_TOKEN_LOSS.sum() - 3.0 + 5.0) / 5, rtol=1e-5)


def test_log_ratio_clamp_bounds_the_ratio():
  new, old = jnp.array([[0.0]]), jnp.array([[-50.0]])  # raw ratio e^50
  config = plain_loss(log_ratio_clamp=2.0, dual_clip_c=None)
  loss, metrics = rl.policy_loss(new, old, jnp.array([-1.0]), jnp.ones((1, 1)), config)
  np.testing.assert_allclose(loss, np.exp(2.0), rtol=1e-6)
  assert (
    float(jax.grad(lambda lp: rl.policy_loss(lp, old, jnp.array([-1.0]), jnp.ones((1, 1)), config)[0])(new)[0, 0])
    == 0.0
  )


def _token_weights(mask, mode, max_gen_len):
  """d aggregate / d token_loss, by hand."""
  seq_tokens = mask.sum(-1, keepdims=True)
  num_seqs = max((seq_tokens > 0).sum(), 1)
  if mode == "token-mean":
    return mask / max(mask.sum(), 1)
  if mode == "seq-mean-token-sum":
    return mask / num_seqs
  if mode == "seq-mean-token-mean":
    return mask / np.maximum(seq_tokens, 1) / num_seqs
  return mask / (num_seqs * (max_gen_len or mask.shape[-1]))


@pytest.mark.parametrize("mode", rl.LOSS_AGGREGATIONS)
@pytest.mark.parametrize("kl_estimator", ["k1", "k2", "k3"])
def test_gradient_matches_closed_form(mode, kl_estimator):
  rng = np.random.default_rng(0)
  n, t = 6, 7
  old = rng.uniform(-3, -0.1, (n, t)).astype(np.float32)
  new = (old + rng.normal(0, 0.4, (n, t))).astype(np.float32)
  ref = (old + rng.normal(0, 0.3, (n, t))).astype(np.float32)
  adv = np.array([1.5, -0.7, 0.3, -2.0, 0.9, -0.1], np.float32)
  mask = (rng.uniform(size=(n, t)) < 0.7).astype(np.float32)
  mask[2] = 0.0  # an empty completion
  new[3, :3] = old[3, :3] + np.log([4.0, 5.0, 3.5])  # negative advantage, ratio > c: dual-clip region
  mask[3, :3] = 1.0
  config = plain_loss(
    eps_low=0.2,
    eps_high=0.28,
    dual_clip_c=3.0,
    aggregation=mode,
    max_gen_len=16,
    kl_coef=0.05,
    kl_estimator=kl_estimator,
  )

  def loss_fn(lp):
    return rl.policy_loss(
      lp, jnp.asarray(old), jnp.asarray(adv), jnp.asarray(mask), config, ref_logprobs=jnp.asarray(ref)
    )[0]

  grad = np.asarray(jax.grad(loss_fn)(jnp.asarray(new)))

  ratio = np.exp(new - old)
  a = adv[:, None]
  unclipped, clipped = -a * ratio, -a * np.clip(ratio, 0.8, 1.28)
  # The surrogate's derivative is -A * ratio where the unclipped branch is taken (inside the clip range
  # both branches coincide), and 0 where the clipped constant or the dual-clip cap is taken.
  unclipped_active = unclipped >= clipped
  dual_active = (a < 0) & (np.maximum(unclipped, clipped) > -a * 3.0)
  assert unclipped_active.any() and (~unclipped_active).any() and dual_active.any()
  d_pg = np.where(unclipped_active & ~dual_active, -a * ratio, 0.0)
  d = ref - new
  d_kl = {"k1": np.ones_like(d), "k2": -d, "k3": 1.0 - np.exp(d)}[kl_estimator]
  expected = (d_pg + 0.05 * d_kl) * _token_weights(mask, mode, 16)
  np.testing.assert_allclose(grad, expected, rtol=1e-4, atol=1e-7)


def test_kl_estimators_hand_values_and_exact_expectation():
  lp, ref = jnp.array([[-1.0]]), jnp.array([[-2.0]])
  np.testing.assert_allclose(rl.kl_penalty(lp, ref, "k1"), [[1.0]])
  np.testing.assert_allclose(rl.kl_penalty(lp, ref, "k2"), [[0.5]])
  np.testing.assert_allclose(rl.kl_penalty(lp, ref, "k3"), [[np.exp(-1.0)]], rtol=1e-6)
  # Over the full support of pi, E_pi[k1] = E_pi[k3] = KL(pi || ref) exactly; k3 is non-negative per token.
  p = np.array([0.5, 0.3, 0.15, 0.05])
  q = np.array([0.25, 0.25, 0.25, 0.25])
  kl = float(np.sum(p * np.log(p / q)))
  logp, logq = jnp.log(jnp.asarray(p))[None], jnp.log(jnp.asarray(q))[None]
  for est in ("k1", "k3"):
    np.testing.assert_allclose(float(jnp.sum(p * rl.kl_penalty(logp, logq, est))), kl, rtol=1e-5)
  assert bool(jnp.all(rl.kl_penalty(logp, logq, "k3") >= 0))
  assert float(jnp.sum(p * rl.kl_penalty(logp, logq, "k2"))) != pytest.approx(kl, rel=1e-3)


def test_kl_penalty_added_to_loss_and_required_ref():
  new, old, adv, mask = _region_inputs()
  ref = new - 0.5  # d = -0.5 on every token
  config = plain_loss(eps_high=0.28, kl_coef=0.1, kl_estimator="k2")
  loss, metrics = rl.policy_loss(new, old, adv, mask, config, ref_logprobs=ref)
  np.testing.assert_allclose(loss, EXPECTED_TOKEN_LOSS.mean() + 0.1 * 0.125, rtol=1e-5)
  np.testing.assert_allclose(metrics["kl"], 0.125, rtol=1e-5)
  with pytest.raises(ValueError, match="ref_logprobs"):
    rl.policy_loss(new, old, adv, mask, config)


def test_entropy_and_reward_metrics():
  n, t, v = 3, 4, 6
  logits = jnp.zeros((n, t, v))
  rewards = jnp.array([[1.0, 0.2], [0.0, 0.4], [0.5, 0.0]])
  reward_valid = jnp.array([[True, True], [True, True], [True, False]])
  sample_valid = jnp.array([True, True, False])
  _, metrics = rl.policy_loss(
    jnp.zeros((n, t)),
    jnp.zeros((n, t)),
    jnp.ones(n),
    jnp.ones((n, t)),
    plain_loss(),
    logits=logits,
    rewards=rewards,
    reward_valid=reward_valid,
    sample_valid=sample_valid,
  )
  np.testing.assert_allclose(metrics["entropy"], np.log(v), rtol=1e-6)
  np.testing.assert_allclose(metrics["reward_mean"], [0.5, 0.3], rtol=1e-6)
  np.testing.assert_allclose(metrics["num_tokens"], 8)
  # An entropy bonus lowers the loss by coef * entropy.
  config = plain_loss(entropy_coef=0.01)
  loss, _ = rl.policy_loss(jnp.zeros((n, t)), jnp.zeros((n, t)), jnp.ones(n), jnp.ones((n, t)), config, logits=logits)
  np.testing.assert_allclose(loss, -1.0 - 0.01 * np.log(v), rtol=1e-6)


@pytest.mark.parametrize("mode", rl.LOSS_AGGREGATIONS)
def test_invalid_samples_drop_out_of_the_loss(mode):
  rng = np.random.default_rng(1)
  new = jnp.asarray(rng.normal(-1, 0.2, (4, 5)), jnp.float32)
  old = jnp.asarray(rng.normal(-1, 0.2, (4, 5)), jnp.float32)
  adv = jnp.array([1.0, -1.0, 5.0, 0.5])
  mask = jnp.ones((4, 5))
  config = plain_loss(aggregation=mode)
  keep = jnp.array([True, True, False, True])
  dropped = rl.policy_loss(new, old, adv, mask, config, sample_valid=keep)[0]
  subset = rl.policy_loss(new[keep], old[keep], adv[keep], mask[keep], config)[0]
  np.testing.assert_allclose(dropped, subset, rtol=1e-6)


@pytest.mark.parametrize("mode", rl.LOSS_AGGREGATIONS)
def test_degenerate_inputs_are_finite(mode):
  config = plain_loss(aggregation=mode, kl_coef=0.1)
  new = jnp.full((3, 4), -1.0)
  cases = [
    (jnp.zeros((3, 4)), jnp.ones(3), jnp.array([True, True, True])),  # every completion empty
    (jnp.ones((3, 4)), jnp.zeros(3), jnp.array([True, True, True])),  # zero-variance groups
    (jnp.ones((3, 4)), jnp.ones(3), jnp.array([False, False, False])),  # every reward failed
  ]
  for mask, adv, valid in cases:

    def loss_fn(lp):
      return rl.policy_loss(
        lp, new, adv, mask, config, ref_logprobs=new - 1.0, sample_valid=valid, logits=jnp.zeros((3, 4, 5))
      )

    (loss, metrics), grad = jax.value_and_grad(loss_fn, has_aux=True)(new)
    assert bool(jnp.isfinite(loss)) and bool(jnp.all(jnp.isfinite(grad)))
    assert all(bool(jnp.all(jnp.isfinite(v))) for v in metrics.values())
  # With no tokens to learn from, nothing moves.
  assert (
    float(
      jnp.abs(
        jax.grad(lambda lp: rl.policy_loss(lp, new, jnp.ones(3), jnp.zeros((3, 4)), config, ref_logprobs=new - 1.0)[0])(
          new
        )
      ).max()
    )
    == 0.0
  )


def test_jit_with_static_config_and_vmap():
  rng = np.random.default_rng(2)
  new = jnp.asarray(rng.normal(-1, 0.3, (2, 4, 5)), jnp.float32)
  old = jnp.asarray(rng.normal(-1, 0.3, (2, 4, 5)), jnp.float32)
  adv = jnp.asarray(rng.normal(size=(2, 4)), jnp.float32)
  mask = jnp.asarray(rng.uniform(size=(2, 4, 5)) < 0.8)
  config = plain_loss(eps_high=0.28, aggregation="seq-mean-token-sum")
  fn = jax.jit(rl.policy_loss, static_argnames="config")
  mapped, metrics = jax.vmap(lambda *a: fn(*a, config=config))(new, old, adv, mask)
  for i in range(2):
    eager, eager_metrics = rl.policy_loss(new[i], old[i], adv[i], mask[i], config)
    np.testing.assert_allclose(mapped[i], eager, rtol=1e-5)
    np.testing.assert_allclose(metrics["clip_frac"][i], eager_metrics["clip_frac"], rtol=1e-6)
