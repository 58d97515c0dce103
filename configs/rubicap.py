"""RubiCap: per-image rubrics (weighted binary criteria, 3/2/1) checked by a judge; reward = weighted pass rate.

Default: the embedded synthetic world (rubrics synthesised from the five-teacher committee vs a weak student,
checked by the rule-based judge). `configs/rubicap.py:paper`: lr 1e-5 cosine with warm-up ratio 0.01, 4 rollouts
per image, max generation 1024, one epoch (50k images at batch 64 ~ 780 steps), judge Qwen2.5-7B-Instruct.
"""

from jaxcap.train.config import base_config, optim, real_model_run


def get_config(variant: str = "default"):
  c = base_config()
  c.name = "rubicap"
  c.workdir = "runs/rubicap"
  c.reward = {"rubicap": {"weight": 1.0}}
  if variant == "paper":
    real_model_run(c, max_new_tokens=1024, image_size=448)
    c.rl.update(dict(steps=780, batch_size=64, num_samples=4, micro_batches=16, estimator="grpo"))
    c.rl.optim = optim(1e-5, warmup_ratio=0.01, schedule="cosine")
  elif variant != "default":
    raise ValueError(f"configs/rubicap.py variant {variant!r}: use 'default' or 'paper'")
  return c
