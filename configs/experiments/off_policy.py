"""Asynchronous RL vs the on-policy step on the CapRL main job from the shared SFT start: one-step off-policy
(rl.max_staleness=1: step t+1's round is rolled out and judged while step t updates) and two-step with partial
rollouts (rl.max_staleness=2, rl.partial_rollouts: each checkpoint window's rounds through one paged-engine stream,
samples in flight continuing under the next weights), both with token-level truncated importance sampling against
the sampler's log-probs."""

from jaxcap.experiments.spec import arm, claim, experiment

_CORRECTION = {"rollout_correction": {"is_level": "token"}}


def get_config():
  off_policy = arm("caprl", {"rl": {"max_staleness": 1, **_CORRECTION}})
  partial = arm(
    "caprl", {"rl": {"max_staleness": 2, "partial_rollouts": True, **_CORRECTION}, "rollout": {"engine": "paged"}}
  )
  return experiment(
    title="Asynchronous rollouts (one-step off-policy; two-step with partial rollouts) vs on-policy",
    question=(
      "Rolling out and judging the next steps' rounds during the update hides the judge's latency, but a round is "
      "sampled by weights one or two updates old (with partial rollouts, a sample may span two versions). Do "
      "rl.max_staleness=1 and rl.max_staleness=2 with partial rollouts (token-level truncated IS) reach the "
      "on-policy run's held-out QA at the same number of updates, and how stale are their rounds?"
    ),
    arms={"on_policy": arm("caprl"), "async_partial": partial, "off_policy": off_policy},
    metrics=["qa", "length/words"],
    claims=[
      claim("qa", "off_policy", "on_policy", "=", "verl / AReaL report one-step asynchronous RL matching on-policy"),
      claim(
        "qa", "async_partial", "on_policy", "=", "APRIL / verl fully_async report partial rollouts matching on-policy"
      ),
    ],
    # how stale the rounds are (partial: per token, mean and oldest), how far the sampler's log-probs are from the
    # trainer's, and the share of tokens the correction truncates
    step_metrics=[
      "async/staleness",
      "async/staleness_max",
      "rollout_corr/kl_k3",
      "rollout_corr/log_ppl_abs_diff",
      "rollout_corr/is_truncated_frac",
    ],
  )
