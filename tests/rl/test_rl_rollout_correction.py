"""Rollout correction equals verl's rollout_corr_helper (torch transcription in verl_reference.py): TIS weights at
token and sequence level, every rejection option, the mismatch metrics; all ~0 / no-ops when the sampler and the
trainer compute the same log-probs; and the weights enter the loss as verl's."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jaxcap import rl
from jaxcap.rl import rollout_correction as rc
from jaxcap.train.learner.rl import SAMPLER_OLD_MISMATCH
from tests.rl import verl_reference as verl
from loss_configs import plain_loss

LENGTHS = [7, 3, 5, 1, 6, 4]


def _inputs(seed, scale):
  rng = np.random.default_rng(seed)
  n, t = len(LENGTHS), 7
  mask = (np.arange(t)[None, :] < np.asarray(LENGTHS)[:, None]).astype(np.float32)
  old = rng.uniform(-3.0, -0.05, (n, t)).astype(np.float32)
  beh = (old + scale * rng.standard_normal((n, t))).astype(np.float32)
  return old, beh, mask


def _close(ours, ref, keys):
  for k in keys:
    np.testing.assert_allclose(float(ours[k]), float(ref[k]), rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("scale", [0.02, 0.5], ids=["near", "far"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_importance_weights_equal_verl(level, scale):
  old, beh, mask = _inputs(1, scale)
  config = rc.RolloutCorrectionConfig(is_level=level, is_threshold=1.5)
  w, keep, metrics = rc.rollout_correction(jnp.asarray(old), jnp.asarray(beh), jnp.asarray(mask), config)
  ref_w, ref_metrics = verl.rollout_is_weights(torch.tensor(old - beh), torch.tensor(mask), level, 1.5)
  np.testing.assert_allclose(np.asarray(w), ref_w.numpy(), rtol=1e-6, atol=1e-7)
  assert np.array_equal(np.asarray(keep), mask > 0)
  _close(metrics, ref_metrics, ["is_mean", "is_max", "is_truncated_frac"])
  if scale == 0.5:
    assert float(metrics["is_truncated_frac"]) > 0  # the threshold binds somewhere


@pytest.mark.parametrize("option", [o for o in rc.REJECTIONS if o != "none"])
def test_rejection_equals_verl(option):
  old, beh, mask = _inputs(2, 0.4)
  upper, lower = (1.5, 0.5) if option.endswith("k1") else (0.05, None)
  if option.startswith("seq_sum") and not option.endswith("k1"):
    upper = 0.3
  if option == "seq_mean_k1":
    upper, lower = 1.1, 0.9
  config = rc.RolloutCorrectionConfig(reject=option, reject_upper=upper, reject_lower=lower)
  w, keep, metrics = rc.rollout_correction(jnp.asarray(old), jnp.asarray(beh), jnp.asarray(mask), config)
  spec = f"{lower}_{upper}" if option.endswith("k1") else str(upper)
  ref_mask, ref_metrics = verl.rollout_rejection(torch.tensor(old - beh), torch.tensor(mask), option, spec)
  assert w is None
  np.testing.assert_array_equal(np.asarray(keep).astype(np.float32), ref_mask.numpy())
  _close(metrics, ref_metrics, ["reject_token_frac", "reject_seq_frac"])
  assert 0 < float(metrics["reject_token_frac"]) < 1, "the band rejects some, not all (else the test is weak)"


def test_k1_default_lower_bound_is_the_reciprocal():
  old, beh, mask = _inputs(3, 0.4)
  a = rc.rollout_correction(*map(jnp.asarray, (old, beh, mask)), rc.RolloutCorrectionConfig(reject="token_k1"))
  b = rc.rollout_correction(
    *map(jnp.asarray, (old, beh, mask)), rc.RolloutCorrectionConfig(reject="token_k1", reject_lower=0.5)
  )
  np.testing.assert_array_equal(np.asarray(a[1]), np.asarray(b[1]))


@pytest.mark.parametrize("scale", [0.02, 0.5])
def test_mismatch_metrics_equal_verl(scale):
  old, beh, mask = _inputs(4, scale)
  ours = rc.mismatch_metrics(jnp.asarray(old), jnp.asarray(beh), jnp.asarray(mask))
  ref = verl.offpolicy_metrics(torch.tensor(old), torch.tensor(beh), torch.tensor(mask))
  _close(ours, ref, list(ref))
  assert set(ours) == set(ref)


def test_identical_log_probs_give_zero_mismatch_and_unit_weights():
  old, _, mask = _inputs(5, 0.0)
  ours = rc.mismatch_metrics(jnp.asarray(old), jnp.asarray(old), jnp.asarray(mask))
  for k in ["kl_k1", "kl_k3", "log_ppl_diff", "log_ppl_abs_diff", "chi2_token"]:
    assert abs(float(ours[k])) < 1e-6, k
  # what the RL update logs without computing them when its old log-probs are the sampler's: the same keys, the
  # divergences exactly these values, the log-perplexities not measured (NaN: null in metrics.jsonl)
  assert set(SAMPLER_OLD_MISMATCH) == set(ours)
  for k, v in SAMPLER_OLD_MISMATCH.items():
    assert np.isnan(v) if k.endswith("log_ppl") else float(ours[k]) == v, k
  for level in ["token", "sequence"]:
    for reject in ["seq_sum_k1", "seq_max_k3"]:
      config = rc.RolloutCorrectionConfig(is_level=level, reject=reject, reject_upper=1.01)
      w, keep, m = rc.rollout_correction(jnp.asarray(old), jnp.asarray(old), jnp.asarray(mask), config)
      np.testing.assert_array_equal(np.asarray(w), mask)
      np.testing.assert_array_equal(np.asarray(keep), mask > 0)
      assert float(m["is_max"]) == 1.0 and float(m["is_truncated_frac"]) == 0.0
      assert float(m["reject_token_frac"]) == 0.0 and float(m["reject_seq_frac"]) == 0.0


def test_weights_enter_the_ppo_loss_as_verl():
  """vanilla with rollout_is_weights == policy_loss(is_weights=...) (ratios near the clip range)."""
  old, beh, mask = _inputs(6, 0.3)
  rng = np.random.default_rng(6)
  lp = (old + 0.2 * rng.standard_normal(old.shape)).astype(np.float32)
  adv = rng.standard_normal(old.shape[0]).astype(np.float32)
  config = rc.RolloutCorrectionConfig(is_level="token", is_threshold=2.0)
  w, _, _ = rc.rollout_correction(jnp.asarray(old), jnp.asarray(beh), jnp.asarray(mask), config)
  loss, _ = rl.policy_loss(
    jnp.asarray(lp), jnp.asarray(old), jnp.asarray(adv), jnp.asarray(mask), plain_loss(), is_weights=w
  )
  ref_w, _ = verl.rollout_is_weights(torch.tensor(old - beh), torch.tensor(mask), "token", 2.0)
  ref, _ = verl.vanilla(
    torch.tensor(old), torch.tensor(lp), torch.tensor(adv)[:, None] * torch.tensor(mask), torch.tensor(mask),
    "token-mean", eps_low=0.2, eps_high=0.2, w=ref_w,
  )  # fmt: skip
  np.testing.assert_allclose(float(loss), float(ref), rtol=1e-6, atol=1e-7)


def test_config_validation():
  for bad in [dict(is_level="seq"), dict(reject="token_k4"), dict(is_threshold=0.0), dict(reject_lower=-1.0)]:
    with pytest.raises(ValueError, match="rl.rollout_correction"):
      rc.RolloutCorrectionConfig(**bad)
  assert not rc.RolloutCorrectionConfig().enabled
  assert rc.RolloutCorrectionConfig(reject="seq_mean_k3").enabled
