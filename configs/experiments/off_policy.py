"""One-step off-policy RL (rl.off_policy_steps=1: step t+1's round is rolled out and judged while step t updates,
with token-level truncated importance sampling against the sampler's log-probs) vs the on-policy step, on the CapRL
main job from the shared SFT start."""

from jaxcap.experiments.spec import arm, claim, experiment


def get_config():
  off_policy = arm("caprl", {"rl": {"off_policy_steps": 1, "rollout_correction": {"is_level": "token"}}})
  return experiment(
    title="One-step off-policy rollouts vs on-policy",
    question=(
      "Rolling out and judging the next step's round during the update hides the judge's latency, but the round "
      "is sampled by weights one update old. Does rl.off_policy_steps=1 (with token-level truncated IS) reach the "
      "on-policy run's held-out QA at the same number of updates, and how stale are its rounds?"
    ),
    arms={"on_policy": arm("caprl"), "off_policy": off_policy},
    metrics=["qa", "length/words"],
    claims=[
      claim("qa", "off_policy", "on_policy", "=", "verl / AReaL report one-step asynchronous RL matching on-policy"),
    ],
    # the share of steps trained on a queued round, and how far the sampler's log-probs are from the trainer's
    step_metrics=[
      "offpolicy/staleness",
      "rollout_corr/kl_k3",
      "rollout_corr/log_ppl_abs_diff",
      "rollout_corr/is_truncated_frac",
    ],
  )
