"""The RL functions give the same numbers when the batch is sharded over a device mesh.

Runs in a subprocess because the number of host devices is fixed when jax first initialises.
"""

import os
import pathlib
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
  """
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from jaxcap import rl

    assert jax.device_count() == 2, jax.devices()
    mesh = Mesh(np.array(jax.devices()), ("data",))
    shard = lambda x: jax.device_put(x, NamedSharding(mesh, P("data", *([None] * (x.ndim - 1)))))

    rewards = jax.random.uniform(jax.random.PRNGKey(0), (4, 8, 3))
    valid = jax.random.bernoulli(jax.random.PRNGKey(1), 0.9, rewards.shape)
    weights = jnp.array([0.1, 0.3, 0.3])
    fn = jax.jit(rl.group_advantages, static_argnames="estimator")
    for estimator in rl.ADVANTAGE_ESTIMATORS:
        sharded = fn(shard(rewards), weights, shard(valid), estimator=estimator)
        assert len(sharded.advantages.sharding.device_set) == 2
        local = rl.group_advantages(rewards, weights, valid, estimator=estimator)
        np.testing.assert_allclose(sharded.advantages, local.advantages, rtol=1e-5, atol=1e-6)

    adv = local.advantages.reshape(-1)
    n, t = adv.shape[0], 16
    new = jax.random.normal(jax.random.PRNGKey(2), (n, t)) * 0.3 - 1.0
    old = jax.random.normal(jax.random.PRNGKey(3), (n, t)) * 0.3 - 1.0
    mask = jax.random.bernoulli(jax.random.PRNGKey(4), 0.8, (n, t))
    config = rl.PolicyLossConfig(eps_high=0.28, aggregation="seq-mean-token-sum", kl_coef=0.01)
    loss_fn = lambda lp, o, a, m: rl.policy_loss(lp, o, a, m, config, ref_logprobs=o)[0]
    grad_fn = jax.jit(jax.value_and_grad(loss_fn))
    sharded_loss, sharded_grad = grad_fn(shard(new), shard(old), shard(adv), shard(mask))
    local_loss, local_grad = jax.value_and_grad(loss_fn)(new, old, adv, mask)
    np.testing.assert_allclose(sharded_loss, local_loss, rtol=1e-5)
    np.testing.assert_allclose(sharded_grad, local_grad, rtol=1e-5, atol=1e-8)
    print("OK")
    """
)


def test_sharded_mesh_matches_single_device():
  env = dict(os.environ)
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip()
  env["JAX_PLATFORMS"] = "cpu"
  repo = pathlib.Path(__file__).resolve().parents[2]
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo), env.get("PYTHONPATH", "")]))
  result = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr[-4000:]
  assert "OK" in result.stdout
