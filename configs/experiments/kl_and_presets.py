"""CapRL's KL term to the SFT policy (0.05 vs 0), and the paper's preset (GRPO + KL) vs the released code's
(RLOO, KL 0, 8 questions with replacement, a 'cannot answer' option, reward x 2)."""

from jaxcap.experiments.spec import arm, claim, experiment

RELEASED = {
  "reward": {"caprl": {"weight": 1.0, "preset": "released_code"}},
  "rl": {"estimator": "rloo", "loss": {"kl_coef": 0.0}},
}


def get_config():
  return experiment(
    title="KL to the SFT policy; paper vs released-code presets",
    question=(
      "What does the KL term to the SFT policy buy, and do the released code's settings (no KL, RLOO, 2x reward) "
      "train the same captioner as the paper's? 'padding' is the share of images where a padded caption (the first "
      "sentence repeated, or generic filler) beats the policy's own caption under the CapRL reward."
    ),
    arms={
      "paper_kl": arm("caprl"),
      "no_kl": arm("caprl", {"rl": {"loss": {"kl_coef": 0.0}}}),
      "released": arm("caprl", RELEASED),
    },
    metrics=["qa", "length/words", "linguistic", "precision", "hack/caprl/padding", "hack/caprl_released/padding"],
    claims=[
      claim("qa", "paper_kl", "no_kl", "none", "the paper trains with KL, the released code without; no ablation"),
      claim("length/words", "no_kl", "paper_kl", "none", "no published figure"),
      claim("qa", "paper_kl", "released", "none", "no published comparison of the two presets"),
      claim("hack/caprl/padding", "no_kl", "paper_kl", "none", "no published figure"),
    ],
    smoke_arms=["paper_kl", "no_kl"],
  )
