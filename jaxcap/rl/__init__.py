"""RL core: group advantages from [B, G, R] rewards, reward masks, the policy losses and rollout correction."""

from jaxcap.rl.advantages import (
  DEFAULT_EPS,
  ADVANTAGE_ESTIMATORS,
  Advantages,
  c_gdpo_advantages,
  dr_grpo_advantages,
  group_advantages,
  grpo_advantages,
  reward_means,
  rloo_advantages,
  sample_validity,
  weighted_reward,
)
from jaxcap.rl.aggregation import LOSS_AGGREGATIONS, aggregate_loss
from jaxcap.rl.kl import KL_ESTIMATORS, entropy_from_logits, kl_penalty
from jaxcap.rl.losses import PolicyLossConfig, policy_loss
from jaxcap.rl.reinforce_estimators import (
  gpg_advantages,
  grpo_passk_advantages,
  opo_advantages,
  reinforce_pp_advantages,
  reinforce_pp_baseline_advantages,
)
from jaxcap.rl import covariance_losses as _covariance_losses  # registers clip_cov, kl_cov
from jaxcap.rl.policy_losses import POLICY_LOSSES, PolicyLoss, Surrogate, SurrogateInputs, register_policy_loss
from jaxcap.rl.masks import (
  LengthMaskConfig,
  LengthUnit,
  apply_length_mask,
  apply_length_mask_config,
  caption_lengths,
  length_in_range,
  length_ratio,
)

__all__ = [
  "ADVANTAGE_ESTIMATORS", "Advantages", "DEFAULT_EPS", "KL_ESTIMATORS", "LOSS_AGGREGATIONS", "LengthMaskConfig",
  "LengthUnit", "POLICY_LOSSES", "PolicyLoss", "PolicyLossConfig", "Surrogate", "SurrogateInputs", "aggregate_loss", "apply_length_mask", "apply_length_mask_config",
  "c_gdpo_advantages", "caption_lengths", "dr_grpo_advantages", "entropy_from_logits", "group_advantages",
  "gpg_advantages", "grpo_advantages", "grpo_passk_advantages", "opo_advantages", "reinforce_pp_advantages",
  "reinforce_pp_baseline_advantages", "kl_penalty", "length_in_range", "length_ratio", "policy_loss", "register_policy_loss",
  "reward_means",
  "rloo_advantages", "sample_validity", "weighted_reward",
]  # fmt: skip
