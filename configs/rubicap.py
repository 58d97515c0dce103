"""RubiCap: per-image rubrics (weighted binary criteria, 3/2/1) checked by a judge; reward = weighted pass rate.

Default: the embedded synthetic world (rubrics synthesised from the five-teacher committee vs a weak student,
checked by the rule-based judge). `configs/rubicap.py:paper`: lr 1e-5 cosine with warm-up ratio 0.01, 4 rollouts
per image, max generation 1024, one epoch (50k images at batch 64 ~ 780 steps), judge Qwen2.5-7B-Instruct.
"""

from jaxcap.train.config import base_config, optim


def get_config(variant: str = "default"):
  c = base_config()
  c.name = "rubicap"
  c.workdir = "runs/rubicap"
  c.reward = {"rubicap": {"weight": 1.0}}
  if variant == "paper":
    c.sft.steps = 0
    c.rl.update(dict(steps=780, batch_size=64, num_samples=4, micro_batches=16, estimator="grpo"))
    c.rl.optim = optim(1e-5, warmup_ratio=0.01, schedule="cosine")
    c.sampling.max_new_tokens = 1024
    c.data.image_size = 448
    c.model.update(dict(dtype="bfloat16", param_dtype="bfloat16", remat="full"))
    c.judge.kind = "http"
  elif variant != "default":
    raise ValueError(f"configs/rubicap.py variant {variant!r}: use 'default' or 'paper'")
  return c
