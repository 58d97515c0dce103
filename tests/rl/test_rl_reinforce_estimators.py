"""REINFORCE++ (and its baseline form), GPG, OPO and GRPO pass@k equal verl's outcome-reward estimators (torch
transcription in verl_reference.py) on the weighted reward s = w . r, with verl's token-weighted statistics fed the
completion lengths; an invalid rollout is the same as an absent one."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jaxcap import rl
from tests.rl import verl_reference as verl

B, G, T = 3, 4, 7
WEIGHTS = np.array([0.7, 0.3], np.float32)
NAMES = ["reinforce_pp", "reinforce_pp_baseline", "gpg", "opo", "grpo_passk"]


def _inputs(seed):
  rng = np.random.default_rng(seed)
  rewards = rng.uniform(0, 1, (B, G, 2)).astype(np.float32)
  lengths = rng.integers(1, T + 1, (B, G)).astype(np.int32)
  return rewards, lengths


def _verl(name, scores, lengths, groups):
  """verl on flattened rollouts: the outcome reward at each response's last token."""
  n = len(scores)
  mask = torch.tensor((np.arange(T)[None, :] < np.asarray(lengths)[:, None]).astype(np.float32))
  tlr = torch.zeros((n, T))
  tlr[torch.arange(n), torch.tensor(np.asarray(lengths) - 1)] = torch.tensor(scores)
  index = list(groups)
  if name == "reinforce_pp":
    adv = verl.reinforce_pp(tlr, mask)
  elif name == "reinforce_pp_baseline":
    adv = verl.reinforce_pp_baseline(tlr, mask, index)
  elif name == "gpg":
    adv = verl.gpg_advantage(tlr, mask, index)
  else:
    adv = getattr(verl, name)(tlr, mask, index)
  return adv[:, 0].numpy()


def _ours(name, rewards, lengths, valid=None):
  fn = rl.ADVANTAGE_ESTIMATORS[name]
  kw = {"lengths": jnp.asarray(lengths)} if getattr(fn, "uses_lengths", False) else {}
  out = fn(jnp.asarray(rewards), jnp.asarray(WEIGHTS), None if valid is None else jnp.asarray(valid), **kw)
  return np.asarray(out.advantages), np.asarray(out.sample_valid)


@pytest.mark.parametrize("name", NAMES)
def test_equal_verl(name):
  rewards, lengths = _inputs(0)
  adv, sample_valid = _ours(name, rewards, lengths)
  scores = (rewards * WEIGHTS).sum(-1).reshape(-1)
  ref = _verl(name, scores, lengths.reshape(-1), np.repeat(np.arange(B), G))
  assert sample_valid.all()
  np.testing.assert_allclose(adv.reshape(-1), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_an_invalid_rollout_is_an_absent_one(name):
  rewards, lengths = _inputs(1)
  valid = np.ones(rewards.shape, bool)
  valid[1, 2, 0] = False  # a failed judgment of a weighted dimension
  adv, sample_valid = _ours(name, rewards, lengths, valid)
  assert not sample_valid[1, 2] and adv[1, 2] == 0.0
  keep = sample_valid.reshape(-1)
  scores = (rewards * WEIGHTS).sum(-1).reshape(-1)[keep]
  ref = _verl(name, scores, lengths.reshape(-1)[keep], np.repeat(np.arange(B), G)[keep])
  np.testing.assert_allclose(adv.reshape(-1)[keep], ref, rtol=1e-5, atol=1e-6)


def test_hand_computed():
  rewards = np.array([[[1.0], [0.0], [0.0], [3.0]]], np.float32)
  lengths = np.array([[1, 1, 2, 4]], np.int32)
  one = np.ones(1, np.float32)
  # OPO: baseline (1 * 1 + 4 * 3) / 8 = 13 / 8
  opo = rl.ADVANTAGE_ESTIMATORS["opo"](jnp.asarray(rewards), jnp.asarray(one), lengths=jnp.asarray(lengths))
  np.testing.assert_allclose(opo.advantages, rewards[..., 0] - 13 / 8, rtol=1e-6)
  # GPG: alpha = 4 rollouts / 2 non-zero = 2; mean 1
  gpg = rl.ADVANTAGE_ESTIMATORS["gpg"](jnp.asarray(rewards), jnp.asarray(one))
  np.testing.assert_allclose(gpg.advantages, 2 * (rewards[..., 0] - 1.0), rtol=1e-6)
  # pass@k: only the best, (3 - 1) / std([1, 0, 0, 3]) (N - 1)
  pk = rl.ADVANTAGE_ESTIMATORS["grpo_passk"](jnp.asarray(rewards), jnp.asarray(one))
  np.testing.assert_allclose(pk.advantages, [[0, 0, 0, 2 / (np.std([1, 0, 0, 3], ddof=1) + 1e-6)]], rtol=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_jit_and_degenerate_groups_are_finite(name):
  rewards = np.ones((2, G, 2), np.float32)
  lengths = np.full((2, G), 3, np.int32)
  fn = rl.ADVANTAGE_ESTIMATORS[name]
  kw = {"lengths": jnp.asarray(lengths)} if getattr(fn, "uses_lengths", False) else {}
  out = jax.jit(lambda r: fn(r, jnp.asarray(WEIGHTS), **kw))(jnp.asarray(rewards))
  assert np.isfinite(np.asarray(out.advantages)).all()
  np.testing.assert_allclose(out.advantages, 0.0, atol=1e-6)
