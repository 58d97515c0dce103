"""The RL functions give the same numbers when the batch is sharded over a device mesh (two of the test
session's virtual CPU devices, tests/conftest.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxcap import rl
from loss_configs import plain_loss


@pytest.fixture(scope="module")
def shard():
  assert jax.device_count() >= 2, jax.devices()
  mesh = Mesh(np.array(jax.devices()[:2]), ("data",))

  def put(x):
    out = jax.device_put(x, NamedSharding(mesh, P("data", *([None] * (x.ndim - 1)))))
    assert len(out.sharding.device_set) == 2
    return out

  return put


def test_advantages_on_a_sharded_batch_match_one_device(shard):
  rewards = jax.random.uniform(jax.random.PRNGKey(0), (4, 8, 3))
  valid = jax.random.bernoulli(jax.random.PRNGKey(1), 0.9, rewards.shape)
  weights = jnp.array([0.1, 0.3, 0.3])
  fn = jax.jit(rl.group_advantages, static_argnames="estimator")
  for estimator in rl.ADVANTAGE_ESTIMATORS:
    sharded = fn(shard(rewards), weights, shard(valid), estimator=estimator)
    assert len(sharded.advantages.sharding.device_set) == 2
    local = rl.group_advantages(rewards, weights, valid, estimator=estimator)
    np.testing.assert_allclose(sharded.advantages, local.advantages, rtol=1e-5, atol=1e-6, err_msg=estimator)


def test_policy_loss_and_gradient_on_a_sharded_batch_match_one_device(shard):
  n, t = 32, 16
  adv = jax.random.normal(jax.random.PRNGKey(5), (n,))
  new = jax.random.normal(jax.random.PRNGKey(2), (n, t)) * 0.3 - 1.0
  old = jax.random.normal(jax.random.PRNGKey(3), (n, t)) * 0.3 - 1.0
  mask = jax.random.bernoulli(jax.random.PRNGKey(4), 0.8, (n, t))
  config = plain_loss(eps_high=0.28, aggregation="seq-mean-token-sum", kl_coef=0.01)
  loss_fn = lambda lp, o, a, m: rl.policy_loss(lp, o, a, m, config, ref_logprobs=o)[0]  # noqa: E731
  sharded_loss, sharded_grad = jax.jit(jax.value_and_grad(loss_fn))(shard(new), shard(old), shard(adv), shard(mask))
  local_loss, local_grad = jax.value_and_grad(loss_fn)(new, old, adv, mask)
  assert len(sharded_grad.sharding.device_set) == 2
  np.testing.assert_allclose(sharded_loss, local_loss, rtol=1e-5)
  np.testing.assert_allclose(sharded_grad, local_grad, rtol=1e-5, atol=1e-8)
