"""BalCapRL's ablation: c-GDPO (each reward normalised within its group before weighting) vs GRPO (the weighted sum
normalised), on the three BalCapRL rewards with the length mask, from the shared SFT start."""

from jaxcap.experiments.spec import arm, claim, experiment


def get_config():
  return experiment(
    title="c-GDPO vs GRPO on BalCapRL's rewards",
    question=(
      "Does normalising each reward within its group before weighting (c-GDPO) train a better captioner than "
      "GRPO on the weighted sum? 'collapsed / distinct pairs' is Proposition 1 in the wild: of the caption pairs "
      "in a rollout group whose reward vectors differ (distinct), those whose weighted sums agree exactly (collapsed: "
      "GRPO gives them one advantage), summed over every RL step."
    ),
    arms={
      "c_gdpo": arm("balcaprl"),
      "grpo": arm("balcaprl", {"rl": {"estimator": "grpo"}}),
    },
    metrics=["precision", "recall", "linguistic", "prl_hmean", "dcscore/f1", "caparena/score", "length/words"],
    claims=[
      claim("dcscore/f1", "c_gdpo", "grpo", "+", "DCScore 52.0 (c-GDPO) vs 38.0 (GRPO)"),
      claim("caparena/score", "c_gdpo", "grpo", "+", "CapArena -12.0 vs -71.8"),
      claim("prl_hmean", "c_gdpo", "grpo", "+", "implied: balanced precision / recall / linguistic"),
    ],
  )
