"""CapRL: reward = accuracy of a caption-only answerer on the image's multiple-choice questions.

Default: the embedded synthetic world on CPU (SFT warm start on incomplete captions, then GRPO with the
rule-based answerer). For a real Qwen2.5-VL / Qwen3-VL checkpoint (`--config.model.checkpoint=DIR`):
  :paper          the paper's hyper-parameters where it states them, the released code's elsewhere: G = 8, RLOO
                  with KL 0 as released (the paper says GRPO + KL), actor lr 1e-6, warm-up 20 steps, temperature
                  1.0, 8 questions drawn with replacement, options shuffled with a "cannot answer" option, reward x2
  :released       CapRL's released recipe (OpenRLHF launcher + reward server), field by field
  :released_plus  CapRL++'s released recipe on images (verl `train_caprl.sh` + `serve_rm.py --task image`): the
                  image stage of S2D-Boot; its video stage is configs/caprl_video.py:released
docs/recipes.md has the table of every released setting beside these presets, and where they differ.
"""

from jaxcap.config_files import base_config, optim, real_model_run, released_answerer, released_plus

VARIANTS = ("default", "paper", "released", "released_plus")


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
  elif variant == "released":
    # OpenRLHF: RLOO, KL 0, actor lr 1e-6 with 20 warm-up steps, rollout batch 128 x 8 samples, temperature 1,
    # up to 4,096 new tokens; PPO's symmetric clip 0.2, no dual clip
    real_model_run(c, max_new_tokens=4096, max_pixels=448 * 448)
    c.name, c.workdir = "caprl_released", "runs/caprl_released"
    c.data.prompt = "Please describe this image in detail."
    c.reward = {"caprl": {"weight": 1.0, "preset": "caprl"}}  # 8 draws, options as the data gives them, x2
    released_answerer(c, video=False)
    c.rl.update(dict(steps=600, batch_size=128, num_samples=8, micro_batches=32, estimator="rloo"))
    c.rl.optim = optim(1e-6, warmup_steps=20, schedule="constant")
    c.rl.loss.update(dict(eps_low=0.2, eps_high=0.2, dual_clip_c=None))
    c.sampling.temperature = 1.0
  elif variant == "released_plus":
    released_plus(c, video=False)
  elif variant != "default":
    raise ValueError(f"configs/caprl.py variant {variant!r}: use one of {', '.join(VARIANTS)}")
  return c
