"""The policy-loss registry on the CapRL main job: GRPO's PPO clip vs GSPO (sequence-level ratio), CISPO (clipped
IS weight, every token keeps its gradient) and SAPO (a smooth gate), from the shared SFT start."""

from jaxcap.experiments.spec import arm, claim, experiment


def _loss(policy: str) -> dict:
  return arm("caprl", {"rl": {"loss": {"policy": policy}}})


def get_config():
  return experiment(
    title="Policy losses: PPO clip vs GSPO vs CISPO vs SAPO",
    question=(
      "Does the choice of surrogate (rl.loss.policy) change what CapRL's GRPO learns on the embedded default? "
      "One update per rollout batch keeps the ratio near 1, so the methods differ mainly in aggregation "
      "(GSPO, SAPO: per sequence) and in CISPO's gradient on clipped tokens."
    ),
    arms={"ppo": arm("caprl"), "gspo": _loss("gspo"), "cispo": _loss("cispo"), "sapo": _loss("sapo")},
    metrics=["qa", "length/words"],
    claims=[
      claim("qa", "gspo", "ppo", "none", "GSPO reports gains over GRPO on Qwen3 reasoning RL, not captioning"),
      claim("qa", "cispo", "ppo", "none", "CISPO reports faster learning than DAPO on reasoning RL"),
      claim("qa", "sapo", "ppo", "none", "SAPO reports steadier training than GSPO / GRPO on Qwen3"),
      claim("qa", "gspo", "start", "+", "issue 29: the loss trains (held-out QA above the SFT start)"),
      claim("qa", "cispo", "start", "+", "issue 29: the loss trains (held-out QA above the SFT start)"),
    ],
    smoke_arms=["ppo", "gspo"],
    # the sampler's log-probs vs the trainer's (jaxcap.rl.rollout_correction.mismatch_metrics), every RL step
    step_metrics=[
      "rollout_corr/kl_k1",
      "rollout_corr/kl_k3",
      "rollout_corr/log_ppl_abs_diff",
      "rollout_corr/chi2_token",
      "ratio_mean",
      "clip_frac",
    ],
  )
