"""Two-sided length-conditional reward mask."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcap import rl


def test_caption_lengths_words_and_tokens():
  captions = ["A red car  parked\nnear a tree.", "", "one"]
  np.testing.assert_array_equal(rl.caption_lengths(captions), [7, 0, 1])
  assert rl.caption_lengths(captions).dtype == np.int32
  np.testing.assert_array_equal(rl.caption_lengths(captions, "tokens", tokenize=lambda s: list(s.encode())), [30, 0, 3])
  with pytest.raises(ValueError, match="tokenize"):
    rl.caption_lengths(captions, "tokens")
  with pytest.raises(ValueError):
    rl.caption_lengths(captions, "chars")


def test_length_ratio_and_range_boundaries_are_inclusive():
  lengths = jnp.array([4, 5, 10, 20, 21, 3])
  ref = jnp.array([10, 10, 10, 10, 10, 0])
  np.testing.assert_allclose(rl.length_ratio(lengths, ref), [0.4, 0.5, 1.0, 2.0, 2.1, np.inf])
  np.testing.assert_array_equal(rl.length_in_range(lengths, ref), [False, True, True, True, False, False])
  np.testing.assert_array_equal(rl.length_in_range(lengths, ref, 0.3, 5.0), [True, True, True, True, True, False])


def test_mask_zeroes_only_chosen_dimensions_of_out_of_range_captions():
  # B = 1 prompt with reference length 10; G = 5 captions; R = 3 (precision, recall, linguistic).
  rewards = jnp.array([[[0.9, 0.2, 0.8], [0.8, 0.4, 0.7], [0.7, 0.6, 0.9], [0.5, 0.9, 0.95], [0.3, 1.0, 0.9]]])
  lengths = jnp.array([[4, 5, 10, 20, 21]])
  masked, in_range = rl.apply_length_mask(rewards, lengths, jnp.array([10]), masked_dims=(2,))
  np.testing.assert_array_equal(in_range, [[False, True, True, True, False]])
  expected = np.array(rewards)
  expected[0, [0, 4], 2] = 0.0
  np.testing.assert_array_equal(masked, expected)
  # The same through a bool selector, a per-rollout reference [B, G] and a config.
  selector = jnp.array([False, False, True])
  masked2, _ = rl.apply_length_mask(rewards, lengths, jnp.full((1, 5), 10), selector)
  np.testing.assert_array_equal(masked2, expected)
  masked3, _ = rl.apply_length_mask_config(rewards, lengths, jnp.array([10]), rl.LengthMaskConfig(masked_dims=(2,)))
  np.testing.assert_array_equal(masked3, expected)
  # tau_u = 5 (the setting that let length explode in BalCapRL) keeps the 21-word caption's reward.
  loose, _ = rl.apply_length_mask(rewards, lengths, jnp.array([10]), (2,), tau_high=5.0)
  assert float(loose[0, 4, 2]) == pytest.approx(0.9)


def test_masked_rewards_feed_advantages_as_zero_not_invalid():
  rewards = jnp.array([[[0.8], [0.8], [0.8]]])
  masked, _ = rl.apply_length_mask(rewards, jnp.array([[10, 10, 40]]), jnp.array([10]), (0,))
  out = rl.grpo_advantages(masked, jnp.array([1.0]))
  assert bool(jnp.all(out.sample_valid))
  assert float(out.advantages[0, 2]) < 0 < float(out.advantages[0, 0])


def test_length_mask_jit_and_shape_checks():
  rewards = jax.random.uniform(jax.random.PRNGKey(0), (2, 3, 3))
  lengths = jnp.array([[5, 10, 30], [0, 2, 5]])
  ref = jnp.array([10, 2])
  fn = jax.jit(rl.apply_length_mask, static_argnames=("masked_dims", "tau_low", "tau_high"))
  masked, in_range = fn(rewards, lengths, ref, masked_dims=(0, 2))
  np.testing.assert_array_equal(in_range, [[True, True, False], [False, True, False]])
  np.testing.assert_array_equal(masked[0, 2], [0.0, rewards[0, 2, 1], 0.0])
  with pytest.raises(AssertionError):
    rl.apply_length_mask(rewards, lengths[:, :2], ref, (0,))
  with pytest.raises(ValueError):
    rl.LengthMaskConfig(tau_low=3.0, tau_high=2.0)
