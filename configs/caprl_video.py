"""CapRL++ on video: the same QA-utility reward on clips, with temporal (order, motion) questions.

Default: synthetic clips of moving objects (frames at 2 fps, temporal patch 2). For a real checkpoint:
  :paper     configs/caprl.py:paper with video inputs
  :released  CapRL++'s released video recipe (verl `train_caprl.sh`, `serve_rm.py --task video`), field by field:
             the video stage of S2D-Boot, started from the image stage's export (configs/caprl.py:released_plus)
docs/recipes.md has the table of every released setting beside these presets.
"""

from jaxcap.config_files import base_config, optim, real_model_run, released_plus

VARIANTS = ("default", "paper", "released")


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
  elif variant == "released":
    released_plus(c, video=True)
  elif variant != "default":
    raise ValueError(f"configs/caprl_video.py variant {variant!r}: use one of {', '.join(VARIANTS)}")
  return c
