"""Policy-loss configs for hand-computed and reference-parity cases.

`PolicyLossConfig()`'s defaults are the run config's (`rl.loss`: clip-higher eps_high 0.28, KL 0.05 to the
reference; one declaration, jaxcap.rl.losses). The cases here start from plain symmetric PPO without a KL term
(verl's defaults), and name every departure from it."""

from jaxcap.rl import PolicyLossConfig


def plain_loss(**overrides) -> PolicyLossConfig:
  """PolicyLossConfig with eps_high = eps_low = 0.2 and no KL term, then `overrides`."""
  return PolicyLossConfig(**{"eps_high": 0.2, "kl_coef": 0.0, **overrides})
