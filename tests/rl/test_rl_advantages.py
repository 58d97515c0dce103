"""Group-advantage estimators: hand-computed cases, invariances, Proposition 1, degenerate inputs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcap import rl

ESTIMATORS = tuple(rl.ADVANTAGE_ESTIMATORS)  # every registered estimator


def _valid(shape):
  return jnp.ones(shape, dtype=bool)


# One group, G = 4, R = 2, weights (1, 0.5): weighted sums s = (1, 1, 0, 1.5).
HAND_REWARDS = np.array([[[1.0, 0.0], [0.0, 2.0], [0.0, 0.0], [1.0, 1.0]]], np.float32)
HAND_WEIGHTS = np.array([1.0, 0.5], np.float32)


def test_grpo_hand_computed():
  # mean s = 0.875; deviations (0.125, 0.125, -0.875, 0.625); unbiased var = 1.1875 / 3.
  std = np.sqrt(1.1875 / 3)
  expected = np.array([[0.125, 0.125, -0.875, 0.625]]) / (std + 1e-6)
  out = rl.grpo_advantages(jnp.asarray(HAND_REWARDS), jnp.asarray(HAND_WEIGHTS), _valid(HAND_REWARDS.shape))
  np.testing.assert_allclose(out.advantages, expected, rtol=1e-5)
  assert out.advantages.dtype == jnp.float32
  assert bool(jnp.all(out.sample_valid))
  np.testing.assert_allclose(out.metrics["reward_mean"], [0.5, 0.75])


def test_dr_grpo_hand_computed():
  out = rl.dr_grpo_advantages(jnp.asarray(HAND_REWARDS), jnp.asarray(HAND_WEIGHTS))
  np.testing.assert_allclose(out.advantages, [[0.125, 0.125, -0.875, 0.625]], rtol=1e-6)


def test_rloo_hand_computed_is_leave_one_out():
  s = np.array([1.0, 1.0, 0.0, 1.5])
  loo = np.array([s[i] - np.delete(s, i).mean() for i in range(4)])  # (1/6, 1/6, -7/6, 5/6)
  np.testing.assert_allclose(loo, [1 / 6, 1 / 6, -7 / 6, 5 / 6])
  out = rl.rloo_advantages(jnp.asarray(HAND_REWARDS), jnp.asarray(HAND_WEIGHTS))
  np.testing.assert_allclose(out.advantages, [loo], rtol=1e-6)


def test_c_gdpo_hand_computed_two_groups():
  rewards = np.array(
    [
      [[1.0, 0.0], [0.0, 1.0], [0.0, 0.5], [0.0, 0.0]],
      [[0.2, 0.9], [0.4, 0.9], [0.6, 0.3], [0.8, 0.3]],
    ],
    np.float32,
  )
  weights = np.array([0.1, 0.3], np.float32)
  # Group 0, dim 0: values (1, 0, 0, 0): mean 1/4, unbiased std 1/2.
  # Group 0, dim 1: values (0, 1, .5, 0): mean 3/8, unbiased std sqrt(11/48).
  # Group 1, dim 0: values (.2, .4, .6, .8): mean .5, std sqrt(.2/3); dim 1: (.9, .9, .3, .3): mean .6, std sqrt(.12).
  a00 = (np.array([1, 0, 0, 0]) - 0.25) / (0.5 + 1e-6)
  a01 = (np.array([0, 1, 0.5, 0]) - 0.375) / (np.sqrt(11 / 48) + 1e-6)
  a10 = (np.array([0.2, 0.4, 0.6, 0.8]) - 0.5) / (np.sqrt(0.2 / 3) + 1e-6)
  a11 = (np.array([0.9, 0.9, 0.3, 0.3]) - 0.6) / (np.sqrt(0.12) + 1e-6)
  summed = np.stack([0.1 * a00 + 0.3 * a01, 0.1 * a10 + 0.3 * a11])
  whitened = (summed - summed.mean()) / (summed.std(ddof=1) + 1e-6)

  out = rl.c_gdpo_advantages(jnp.asarray(rewards), jnp.asarray(weights))
  np.testing.assert_allclose(out.advantages, whitened, rtol=1e-4, atol=1e-5)
  raw = rl.c_gdpo_advantages(jnp.asarray(rewards), jnp.asarray(weights), normalize_batch=False)
  np.testing.assert_allclose(raw.advantages, summed, rtol=1e-4, atol=1e-5)


def test_dispatch_matches_individual_functions_and_rejects_unknown():
  key = jax.random.PRNGKey(0)
  rewards = jax.random.uniform(key, (3, 5, 3))
  weights = jnp.array([0.1, 0.3, 0.3])
  for name, fn in rl.ADVANTAGE_ESTIMATORS.items():
    # jitted: one program per side instead of an eager compile per op (most of this test's time on CPU)
    dispatched = jax.jit(lambda r, w, name=name: rl.group_advantages(r, w, estimator=name).advantages)
    direct = jax.jit(lambda r, w, fn=fn: fn(r, w).advantages)
    np.testing.assert_array_equal(dispatched(rewards, weights), direct(rewards, weights))
  with pytest.raises(ValueError, match="unknown advantage estimator"):
    rl.group_advantages(rewards, weights, estimator="ppo")


def test_grpo_invariant_to_positive_affine_reward_transform():
  rewards = jax.random.uniform(jax.random.PRNGKey(1), (4, 8, 3))
  weights = jnp.array([0.1, 0.3, 0.3])
  base = rl.grpo_advantages(rewards, weights).advantages
  for scale, shift in [(3.0, -2.0), (0.5, 7.0), (10.0, 0.0)]:
    moved = rl.grpo_advantages(scale * rewards + shift, weights).advantages
    np.testing.assert_allclose(moved, base, atol=2e-4)
  # A negative scale flips the ranking, so the property is not vacuous.
  flipped = rl.grpo_advantages(-rewards, weights).advantages
  np.testing.assert_allclose(flipped, -base, atol=2e-4)
  assert np.abs(np.asarray(base)).max() > 0.5


def test_c_gdpo_invariant_to_per_dimension_affine_transform():
  # Stronger than GRPO: each dimension may be rescaled separately (judges on different scales).
  rewards = jax.random.uniform(jax.random.PRNGKey(2), (4, 8, 3))
  weights = jnp.array([0.1, 0.3, 0.3])
  scale, shift = jnp.array([10.0, 0.5, 2.0]), jnp.array([1.0, -3.0, 0.0])
  np.testing.assert_allclose(
    rl.c_gdpo_advantages(rewards * scale + shift, weights).advantages,
    rl.c_gdpo_advantages(rewards, weights).advantages,
    atol=2e-4,
  )
  grpo_moved = rl.grpo_advantages(rewards * scale + shift, weights).advantages
  assert np.abs(np.asarray(grpo_moved - rl.grpo_advantages(rewards, weights).advantages)).max() > 0.1


def test_proposition_1_advantage_collapse():
  """BalCapRL Prop. 1: same w . r => same GRPO advantage; c-GDPO keeps them apart."""
  weights = jnp.array([0.5, 0.5])
  # Rollouts 0 and 1 lie on the hyper-plane w . r = 0.5; dims have different group stds.
  rewards = jnp.array([[[1.0, 0.0], [0.0, 1.0], [0.0, 0.5], [0.0, 0.0]]])
  grpo = np.asarray(rl.grpo_advantages(rewards, weights).advantages)
  gdpo = np.asarray(rl.c_gdpo_advantages(rewards, weights).advantages)
  assert grpo[0, 0] == grpo[0, 1]
  assert abs(gdpo[0, 0] - gdpo[0, 1]) > 0.05
  # By hand, before batch whitening: dim 0 (1, 0, 0, 0) -> (1.5, -.5, -.5, -.5);
  # dim 1 (0, 1, .5, 0) has mean 3/8 and std sqrt(11/48) -> rollout 1 gets the larger share.
  a0 = np.array([1.5, -0.5, -0.5, -0.5])
  a1 = (np.array([0.0, 1.0, 0.5, 0.0]) - 0.375) / np.sqrt(11 / 48)
  raw = np.asarray(rl.c_gdpo_advantages(rewards, weights, normalize_batch=False).advantages)
  np.testing.assert_allclose(raw[0], 0.5 * a0 + 0.5 * a1, rtol=1e-4)
  assert gdpo[0, 1] > gdpo[0, 0]


def test_proposition_1_random_hyperplanes():
  rng = np.random.default_rng(3)
  weights = np.array([0.1, 0.3, 0.3], np.float32)
  collapsed_gaps, gdpo_gaps = [], []
  for _ in range(20):
    rewards = rng.uniform(size=(1, 6, 3)).astype(np.float32)
    # Move rollout 1 onto rollout 0's hyper-plane: r1 = r0 + v with w . v = 0.
    v = rng.normal(size=3)
    v -= weights * (weights @ v) / (weights @ weights)
    rewards[0, 1] = rewards[0, 0] + 0.3 * v
    grpo = np.asarray(rl.grpo_advantages(jnp.asarray(rewards), jnp.asarray(weights)).advantages)
    gdpo = np.asarray(rl.c_gdpo_advantages(jnp.asarray(rewards), jnp.asarray(weights)).advantages)
    collapsed_gaps.append(abs(grpo[0, 0] - grpo[0, 1]))
    gdpo_gaps.append(abs(gdpo[0, 0] - gdpo[0, 1]))
  assert max(collapsed_gaps) < 1e-4
  assert min(gdpo_gaps) > 1e-3


def test_invalid_reward_excluded_from_statistics_not_treated_as_zero():
  rewards = jnp.array([[[0.9], [0.4], [0.0], [0.7]]])  # rollout 2's judge failed; 0.0 is a placeholder
  valid = jnp.array([[[True], [True], [False], [True]]])
  weights = jnp.array([1.0])
  kept = np.array([0.9, 0.4, 0.7])
  expected_grpo = (kept - kept.mean()) / (kept.std(ddof=1) + 1e-6)
  expected_rloo = np.array([kept[i] - np.delete(kept, i).mean() for i in range(3)])
  for name, expected in [("grpo", expected_grpo), ("dr_grpo", kept - kept.mean()), ("rloo", expected_rloo)]:
    out = rl.group_advantages(rewards, weights, valid, estimator=name)
    np.testing.assert_allclose(np.asarray(out.advantages)[0, [0, 1, 3]], expected, rtol=1e-5)
    assert float(out.advantages[0, 2]) == 0.0
    np.testing.assert_array_equal(out.sample_valid, [[True, True, False, True]])
    as_zero = rl.group_advantages(rewards, weights, estimator=name).advantages
    assert np.abs(np.asarray(as_zero)[0, [0, 1, 3]] - expected).max() > 0.05
  gdpo = rl.c_gdpo_advantages(rewards, weights, valid, normalize_batch=False)
  np.testing.assert_allclose(np.asarray(gdpo.advantages)[0, [0, 1, 3]], expected_grpo, rtol=1e-5)
  np.testing.assert_allclose(gdpo.metrics["reward_mean"], [kept.mean()], rtol=1e-6)


def test_failed_zero_weight_dimension_keeps_sample_valid():
  rewards = jnp.array([[[1.0, 0.3], [0.0, 0.2]]])
  valid = jnp.array([[[True, False], [True, True]]])
  out = rl.grpo_advantages(rewards, jnp.array([1.0, 0.0]), valid)
  np.testing.assert_array_equal(out.sample_valid, [[True, True]])
  out = rl.grpo_advantages(rewards, jnp.array([1.0, 0.5]), valid)
  np.testing.assert_array_equal(out.sample_valid, [[False, True]])


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_degenerate_inputs_give_finite_zero_advantages(estimator):
  weights = jnp.array([0.1, 0.3, 0.3])
  cases = {
    "G=1": (jnp.full((2, 1, 3), 0.7), None),
    # 0.1 is not representable; its float mean can differ by an ulp from the values themselves.
    "all equal": (jnp.full((2, 8, 3), 0.1), None),
    "all invalid": (jnp.ones((2, 4, 3)), jnp.zeros((2, 4, 3), bool)),
    "one valid per group": (jnp.arange(24.0).reshape(2, 4, 3), jnp.arange(8).reshape(2, 4, 1).repeat(3, -1) % 4 == 0),
  }
  for name, (rewards, valid) in cases.items():
    if estimator == "reinforce_pp" and name == "one valid per group":
      continue  # REINFORCE++'s baseline is the batch's: two valid rollouts in it are a signal
    out = rl.group_advantages(rewards, weights, valid, estimator=estimator)
    assert bool(jnp.all(jnp.isfinite(out.advantages))), name
    assert float(jnp.max(jnp.abs(out.advantages))) == 0.0, name
    for key, value in out.metrics.items():
      assert bool(jnp.all(jnp.isfinite(value))), (name, key)


def test_zero_variance_group_beside_a_live_group():
  rewards = jnp.stack([jnp.full((4, 1), 0.3), jnp.array([[0.0], [1.0], [0.0], [1.0]])])
  out = rl.grpo_advantages(rewards, jnp.array([1.0]))
  np.testing.assert_array_equal(out.advantages[0], np.zeros(4))
  np.testing.assert_allclose(out.advantages[1], np.array([-1, 1, -1, 1]) * 0.5 / (np.sqrt(1 / 3) + 1e-6), rtol=1e-5)
  assert float(out.metrics["frac_degenerate_groups"]) == 0.5


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_jit_and_vmap(estimator):
  rewards = jax.random.uniform(jax.random.PRNGKey(4), (3, 2, 5, 3))
  valid = jax.random.bernoulli(jax.random.PRNGKey(5), 0.8, rewards.shape)
  weights = jnp.array([0.1, 0.3, 0.3])
  fn = jax.jit(rl.group_advantages, static_argnames="estimator")
  mapped = jax.vmap(lambda r, v: fn(r, weights, v, estimator=estimator))(rewards, valid)
  for i in range(3):
    eager = rl.group_advantages(rewards[i], weights, valid[i], estimator=estimator)
    np.testing.assert_allclose(mapped.advantages[i], eager.advantages, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(mapped.sample_valid[i], eager.sample_valid)


def test_bfloat16_rewards_give_float32_advantages_and_bad_shapes_raise():
  rewards = jax.random.uniform(jax.random.PRNGKey(6), (2, 4, 3)).astype(jnp.bfloat16)
  out = rl.c_gdpo_advantages(rewards, jnp.array([0.1, 0.3, 0.3]))
  assert out.advantages.dtype == jnp.float32
  with pytest.raises(AssertionError):
    rl.grpo_advantages(rewards, jnp.array([0.1, 0.3]))
  with pytest.raises(AssertionError):
    rl.grpo_advantages(rewards[0], jnp.array([0.1, 0.3, 0.3]))
  with pytest.raises(AssertionError):
    rl.grpo_advantages(rewards, jnp.array([0.1, 0.3, 0.3]), jnp.ones((2, 4, 3), jnp.float32))


def test_collapsed_pairs_counts_distinct_vectors_on_one_weighted_hyperplane():
  from jaxcap.rl.collapse import collapsed_pairs

  w = np.array([1.0, 1.0, 0.0])
  # group 1: (1, 0) and (0, 1) share the sum 1 -> collapsed; (1, 1) differs in sum from both
  # group 2: identical vectors (not distinct), and a third dimension with weight 0 that differs (ignored)
  values = np.array([[1, 0, 0], [0, 1, 0], [1, 1, 0], [0.5, 0.5, 0], [0.5, 0.5, 1], [0.2, 0.3, 0]])
  valid = np.ones_like(values, bool)
  assert collapsed_pairs(values, valid, w, group_size=3) == (1, 3 + 2)
  # a masked dimension is left out: (1, ?) vs (1, 0) compare on the first only -> not distinct
  valid2 = valid.copy()
  valid2[1, 1] = False
  values2 = values.copy()
  values2[1, 0] = 1.0
  assert collapsed_pairs(values2, valid2, w, group_size=3) == (0, 1 + 2)
  with pytest.raises(ValueError, match="G = 4"):
    collapsed_pairs(values, valid, w, group_size=4)
