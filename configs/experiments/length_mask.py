"""BalCapRL's two-sided length-conditional mask on the linguistic reward: tau_u = 2 (the paper's), 5, and off."""

from jaxcap.experiments.spec import arm, claim, experiment


def get_config():
  return experiment(
    title="Length mask: tau_u = 2 vs 5 vs off",
    question=(
      "Does the two-sided length mask (R_ling kept only if 0.5 <= words / reference words <= tau_u) hold caption "
      "length in band, and does loosening it (tau_u = 5) or removing it let length grow at the cost of quality?"
    ),
    arms={
      "tau_2": arm("balcaprl"),
      "tau_5": arm("balcaprl", {"rl": {"length_mask": {"tau_high": 5.0}}}),
      "off": arm("balcaprl", {"rl": {"length_mask": {"dims": []}}}),
    },
    metrics=["length/words", "in_band", "linguistic", "caparena/score", "prl_hmean"],
    claims=[
      claim("length/words", "tau_5", "tau_2", "+", "tau_u = 5 lets length explode (355 words)"),
      claim("caparena/score", "tau_2", "tau_5", "+", "CapArena -3.8 (tau_u 2, BalCapRL-3B) vs -72 (tau_u 5)"),
      claim("in_band", "tau_2", "off", "+", "implied: the mask keeps captions in band"),
      claim("length/words", "off", "tau_2", "+", "implied: without the mask length grows"),
    ],
    smoke_arms=["tau_2", "tau_5"],
  )
