"""CapRL++ on video: the same QA-utility reward on clips, with temporal (order, motion) questions.

Default: synthetic clips of moving objects (frames at 2 fps, temporal patch 2). `:paper` mirrors
configs/caprl.py:paper with video inputs.
"""

from jaxcap.config_files import base_config, optim, real_model_run


def get_config(variant: str = "default"):
  c = base_config()
  c.name = "caprl_video"
  c.workdir = "runs/caprl_video"
  c.world.clip_fraction = 1.0
  c.reward = {"caprl": {"weight": 1.0, "preset": "paper"}}
  c.sampling.max_new_tokens = 96
  c.sft.max_target_tokens = 96
  if variant == "paper":
    c.reward = {"caprl": {"weight": 1.0, "preset": "released_code"}}
    real_model_run(c, max_new_tokens=2048, max_pixels=336 * 336)
    c.rl.update(dict(steps=600, batch_size=16, num_samples=8, micro_batches=8, estimator="rloo"))
    c.rl.optim = optim(1e-6, warmup_steps=20, schedule="constant")
  elif variant != "default":
    raise ValueError(f"configs/caprl_video.py variant {variant!r}: use 'default' or 'paper'")
  return c
