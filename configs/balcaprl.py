"""BalCapRL: precision (correct and pointable claims), recall (covered reference units) and linguistic quality,
the two-sided length-conditional mask on the linguistic reward (0.5 <= len / ref_len <= 2.0), and c-GDPO.

Default: the embedded synthetic world with the rule-based judge. `configs/balcaprl.py:paper`: G = 8, lr 5e-6
cosine, batch 256, no KL, dual-clip PPO (c = 3), "token-sum, sequence-mean" aggregation, weights 0.1/0.3/0.3.
"""

from jaxcap.config_files import base_config, optim, real_model_run


def get_config(variant: str = "default"):
  c = base_config()
  c.name = "balcaprl"
  c.workdir = "runs/balcaprl"
  c.reward = {"balcaprl": {"weight": 1.0, "weights": (0.1, 0.3, 0.3)}}
  c.rl.estimator = "c_gdpo"
  c.rl.loss.aggregation = "seq-mean-token-sum"
  c.rl.length_mask.dims = ["balcaprl/linguistic"]
  if variant == "paper":
    real_model_run(c, max_new_tokens=1024, max_pixels=448 * 448)
    c.rl.update(dict(steps=400, batch_size=256, num_samples=8, micro_batches=64))
    c.rl.optim = optim(5e-6, schedule="cosine")
    c.rl.loss.kl_coef = 0.0
  elif variant != "default":
    raise ValueError(f"configs/balcaprl.py variant {variant!r}: use 'default' or 'paper'")
  return c
