"""RubiCap: per-image rubrics (weighted binary criteria, 3/2/1) checked by a judge; reward = weighted pass rate.

Rubrics (`rubrics.source='policy'`, both variants): RubiCap's stage 1 runs when RL starts, against the greedy
captions of the policy entering RL: consensus of the manifest's five teacher captions (>= 3 agree), minus what the
student already gets right, one weighted criterion per failure (critical 3 / important 2 / minor 1). They are
stored in `<workdir>/rubrics` and reused on resume; `rubrics.source='manifest'` uses the rows' own rubrics.

Default: the embedded synthetic world, checked by the rule-based judge. `configs/rubicap.py:paper`: lr 1e-5
cosine with warm-up ratio 0.01, 4 rollouts per image, max generation 1024, one epoch (50k images at batch 64 ~
780 steps), judge Qwen2.5-7B-Instruct.
"""

from jaxcap.config_files import base_config, optim, real_model_run


def get_config(variant: str = "default"):
  c = base_config()
  c.name = "rubicap"
  c.workdir = "runs/rubicap"
  c.reward = {"rubicap": {"weight": 1.0}}
  if variant == "paper":
    real_model_run(c, max_new_tokens=1024, max_pixels=448 * 448)
    c.rl.update(dict(steps=780, batch_size=64, num_samples=4, micro_batches=16, estimator="grpo"))
    c.rl.optim = optim(1e-5, warmup_ratio=0.01, schedule="cosine")
  elif variant != "default":
    raise ValueError(f"configs/rubicap.py variant {variant!r}: use 'default' or 'paper'")
  return c
