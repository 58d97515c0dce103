"""Every registered policy loss equals verl's formula (torch transcription in verl_reference.py): loss value and
gradient w.r.t. the log-probs, on random inputs with ratios near and far from the clip range, a fully masked row,
every aggregation mode, with and without rollout-correction weights; plus hand-computed on-policy values."""

import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jaxcap import rl
from tests.rl import verl_reference as verl
from loss_configs import plain_loss

LENGTHS = [7, 3, 0, 5, 1, 6]  # row 2 is empty
N, T = len(LENGTHS), 7
EPS = dict(eps_low=0.2, eps_high=0.28)

# name -> (verl function, its keyword arguments, PolicyLossConfig overrides)
CASES = {
  "ppo": (verl.vanilla, dict(EPS, clip_ratio_c=3.0), dict(EPS, dual_clip_c=3.0)),
  "gspo": (verl.gspo, EPS, EPS),
  "gspo_token": (verl.gspo, EPS, EPS),
  "cispo": (verl.cispo, EPS, EPS),
  "sapo": (verl.sapo, dict(tau_pos=1.0, tau_neg=1.05), dict(tau_pos=1.0, tau_neg=1.05)),
  "gpg": (verl.gpg, {}, {}),
  "clip_cov": (verl.clip_cov, dict(EPS, ratio_=1.0, lb=1.0, ub=5.0), dict(EPS, clip_cov_ratio=1.0)),
  "kl_cov": (verl.kl_cov, dict(kl_cov_ratio=0.2, ppo_kl_coef=0.1), dict(kl_cov_ratio=0.2, kl_cov_coef=0.1)),
  "geo_mean": (verl.geo_mean, EPS, EPS),
}


def _inputs(seed, scale):
  rng = np.random.default_rng(seed)
  mask = (np.arange(T)[None, :] < np.asarray(LENGTHS)[:, None]).astype(np.float32)
  lp = rng.uniform(-3.0, -0.05, (N, T)).astype(np.float32)
  old = (lp + scale * rng.standard_normal((N, T))).astype(np.float32)
  adv = rng.standard_normal(N).astype(np.float32)
  adv[4] = 0.0
  w = (rng.uniform(0.3, 2.0, (N, T)) * mask).astype(np.float32)
  return lp, old, adv, mask, w


def _verl(name, mode, lp, old, adv, mask, w):
  fn, kwargs, _ = CASES[name]
  lp_t = torch.tensor(lp, requires_grad=True)
  mask_t = torch.tensor(mask)
  adv_t = torch.tensor(adv)[:, None] * mask_t  # verl's estimators hand over A_i * response_mask
  w_t = None if w is None else torch.tensor(w)
  loss, metrics = fn(torch.tensor(old), lp_t, adv_t, mask_t, mode, w=w_t, **kwargs)
  loss.backward()
  loss = loss.detach()
  return float(loss), lp_t.grad.numpy(), {k: float(v) for k, v in metrics.items()}


def _ours(name, mode, lp, old, adv, mask, w):
  config = plain_loss(policy=name, aggregation=mode, **CASES[name][2])
  kw = {} if w is None else {"is_weights": jnp.asarray(w)}

  def f(x):
    return rl.policy_loss(x, jnp.asarray(old), jnp.asarray(adv), jnp.asarray(mask), config, **kw)

  (loss, metrics), grad = jax.value_and_grad(f, has_aux=True)(jnp.asarray(lp))
  return float(loss), np.asarray(grad), {k: float(v) for k, v in metrics.items()}, config


def _scale(name, config, mask):
  """ours = verl * scale: the documented aggregation differences (see the docstrings)."""
  nonempty = float((mask.sum(-1) > 0).sum())
  if name == "geo_mean":  # verl's torch.mean counts the empty row
    return mask.shape[0] / nonempty
  if config.loss_aggregation == "seq-mean-token-sum-norm":  # verl has no mean over sequences
    return 1.0 / nonempty
  return 1.0


def _params():
  for name in CASES:
    fixed = rl.POLICY_LOSSES[name].aggregation
    for mode in [fixed] if fixed else list(rl.LOSS_AGGREGATIONS):
      yield name, mode


@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "is_weights"])
@pytest.mark.parametrize("scale", [0.05, 1.0], ids=["near", "far"])
@pytest.mark.parametrize("name, mode", list(_params()))
def test_loss_and_gradient_equal_verl(name, mode, scale, weighted):
  lp, old, adv, mask, w = _inputs(seed=zlib.crc32(f"{name}/{mode}".encode()) % 1000, scale=scale)
  w = w if weighted else None
  loss, grad, metrics, config = _ours(name, mode, lp, old, adv, mask, w)
  ref_loss, ref_grad, ref_metrics = _verl(name, mode, lp, old, adv, mask, w)
  s = _scale(name, config, mask)
  np.testing.assert_allclose(loss, ref_loss * s, rtol=1e-6, atol=1e-6)
  if not (name == "gspo" and weighted):  # the sequence form spreads token weights over the sequence (docstring)
    np.testing.assert_allclose(grad * mask, ref_grad * mask * s, rtol=1e-5, atol=1e-6)
  assert np.all(grad[mask == 0] == 0)  # masked tokens carry no gradient
  for k, v in ref_metrics.items():
    np.testing.assert_allclose(metrics[k], v, rtol=1e-5, atol=1e-6, err_msg=k)


def test_far_inputs_do_clip():
  """The 'far' inputs reach the clip range (else the equality above would not cover it)."""
  seeds = [zlib.crc32(f"{name}/{mode}".encode()) % 1000 for name, mode in _params()]
  metrics = [_ours("ppo", "token-mean", *_inputs(seed, 1.0)[:4], None)[2] for seed in seeds[:6]]
  assert all(0.2 < m["clip_frac"] < 0.9 for m in metrics) and any(m["dual_clip_frac"] > 0 for m in metrics)
  near = _ours("ppo", "token-mean", *_inputs(seeds[0], 0.05)[:4], None)[2]
  assert near["clip_frac"] < 0.2


def test_on_policy_values_hand_computed():
  """At r = 1 (old == new): ppo / cispo / gpg give -A log-prob-gradients; the values by hand."""
  lp = jnp.log(jnp.array([[0.5, 0.25, 1.0], [0.5, 0.5, 0.5]]))
  mask = jnp.array([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
  adv = jnp.array([2.0, -1.0])
  value = lambda name, **kw: float(rl.policy_loss(lp, lp, adv, mask, plain_loss(policy=name, **kw))[0])
  # ppo token-mean: (-2 -2 +1 +1 +1) / 5
  np.testing.assert_allclose(value("ppo"), (-2 * 2 + 3) / 5, rtol=1e-6)
  # gspo: sequence ratio 1 -> mean_i -A_i = (-2 + 1) / 2
  np.testing.assert_allclose(value("gspo"), -0.5, rtol=1e-6)
  # sapo: gate(1) = 2 / tau -> mean_i -A_i 2 / tau_i
  np.testing.assert_allclose(value("sapo", tau_pos=1.0, tau_neg=2.0), (-2 * 2 + 1 * 1) / 2, rtol=1e-6)
  # cispo / gpg: -A log p, token-mean
  expected = -(2 * (np.log(0.5) + np.log(0.25)) - 3 * np.log(0.5)) / 5
  np.testing.assert_allclose(value("cispo"), expected, rtol=1e-6)
  np.testing.assert_allclose(value("gpg"), expected, rtol=1e-6)
  # geo_mean: ratio 1 -> mean_i -A_i
  np.testing.assert_allclose(value("geo_mean"), -0.5, rtol=1e-5)


@pytest.mark.parametrize("name", ["ppo", "cispo", "sapo", "gpg"])
def test_on_policy_gradient_is_vanilla_policy_gradient(name):
  """At r = 1 each of these has the REINFORCE gradient -A grad log pi (token-mean), SAPO by its gate's slope 1."""
  lp, _, adv, mask, _ = _inputs(3, 0.0)
  g = jax.grad(lambda x: rl.policy_loss(x, jnp.asarray(lp), jnp.asarray(adv), jnp.asarray(mask),
                                        plain_loss(policy=name))[0])(jnp.asarray(lp))  # fmt: skip
  n = mask.sum() if name != "sapo" else None
  if name == "sapo":  # seq-mean-token-mean
    tokens = mask.sum(-1, keepdims=True)
    expected = -adv[:, None] * mask / np.maximum(tokens, 1) / (tokens > 0).sum()
  else:
    expected = -adv[:, None] * mask / n
  if name in ("cispo", "gpg"):  # the loss is -w A log p: d/dlog p = -w A, the same
    pass
  np.testing.assert_allclose(np.asarray(g), expected, rtol=1e-5, atol=1e-7)


def test_clip_cov_cuts_at_most_the_count_and_only_candidates():
  lp, old, adv, mask, _ = _inputs(5, 0.05)
  config = plain_loss(policy="clip_cov", clip_cov_ratio=0.1, clip_cov_lb=0.0, clip_cov_ub=10.0)
  args = (jnp.asarray(lp), jnp.asarray(old), jnp.asarray(adv), jnp.asarray(mask), config)
  counts = set()
  for seed in range(3):
    _, m = rl.policy_loss(*args, key=jax.random.PRNGKey(seed))
    counts.add(round(float(m["clip_frac"]) * mask.sum()))
  assert counts == {int(0.1 * mask.sum())}  # floor(ratio * tokens) of the candidates, whatever the draw
  _, m = rl.policy_loss(*args)  # no key: deterministic
  assert round(float(m["clip_frac"]) * mask.sum()) == int(0.1 * mask.sum())


def test_config_validation_and_fixed_aggregations():
  for bad in [dict(policy="nope"), dict(tau_pos=0.0), dict(clip_cov_ratio=0.0), dict(clip_cov_lb=5.0),
              dict(kl_cov_coef=-1.0)]:  # fmt: skip
    with pytest.raises(ValueError):
      rl.PolicyLossConfig(**bad)
  with pytest.raises(ValueError, match="rl.loss.policy='nope': unknown policy loss; choose one of ppo"):
    rl.POLICY_LOSSES["nope"]
  assert plain_loss(policy="gspo", aggregation="token-mean").loss_aggregation == "seq-mean-token-mean"
  assert plain_loss(policy="cispo", aggregation="seq-mean-token-sum").loss_aggregation == "seq-mean-token-sum"
  assert set(rl.POLICY_LOSSES) >= {
    "ppo",
    "gspo",
    "gspo_token",
    "cispo",
    "sapo",
    "gpg",
    "clip_cov",
    "kl_cov",
    "geo_mean",
  }
