"""SFT: the papers' supervised baseline (and the RL warm start): next-token loss on reference captions.

Default: the synthetic world's dense reference captions. `:paper`: lr 1e-5 cosine, warm-up ratio 0.03, one
epoch, on the manifest's `reference_caption` field of a real model's data.
"""

from jaxcap.config_files import base_config, optim, real_model_run


def get_config(variant: str = "default"):
  c = base_config()
  c.name = "sft"
  c.workdir = "runs/sft"
  c.rl.steps = 0
  c.sft.targets = "reference"
  c.sft.max_target_tokens = 160
  c.sampling.max_new_tokens = 160
  c.sft.steps = 400
  if variant == "paper":
    c.sft.update(dict(steps=800, batch_size=64, micro_batches=16, max_target_tokens=1024))
    c.sft.optim = optim(1e-5, warmup_ratio=0.03, schedule="cosine")
    real_model_run(c, max_new_tokens=1024, max_pixels=448 * 448, rl=False)
  elif variant != "default":
    raise ValueError(f"configs/sft.py variant {variant!r}: use 'default' or 'paper'")
  return c
