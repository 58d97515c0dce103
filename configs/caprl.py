"""CapRL: reward = accuracy of a caption-only answerer on the image's multiple-choice questions.

Default: the embedded synthetic world on CPU (SFT warm start on incomplete captions, then GRPO with the
rule-based answerer). `configs/caprl.py:paper` sets the paper / released-code hyper-parameters for a real
Qwen2.5-VL-3B: G = 8, RLOO with KL 0 as released (the paper says GRPO + KL), actor lr 1e-6, warm-up 20 steps,
temperature 1.0, 8 questions drawn with replacement, options shuffled with a "cannot answer" option, reward x2.
"""

from jaxcap.config_files import base_config, optim, real_model_run


def get_config(variant: str = "default"):
  c = base_config()
  c.name = "caprl"
  c.workdir = "runs/caprl"
  c.reward = {"caprl": {"weight": 1.0, "preset": "paper"}}
  if variant == "paper":
    c.reward = {"caprl": {"weight": 1.0, "preset": "released_code"}}
    real_model_run(c, max_new_tokens=1024, max_pixels=448 * 448)
    c.rl.update(dict(steps=600, batch_size=16, num_samples=8, micro_batches=4, estimator="rloo"))
    c.rl.optim = optim(1e-6, warmup_steps=20, schedule="constant")
    c.sampling.temperature = 1.0
  elif variant != "default":
    raise ValueError(f"configs/caprl.py variant {variant!r}: use 'default' or 'paper'")
  return c
