"""The run config as ml-collections: the file format of configs/*.py and the `--config.x.y=` override layer over
the typed schema in `jaxcap.config`, where every field is declared once with its type, default, doc, validation and
resume policy. `base_config()` is the schema's defaults, `validate()` reads the schema.
"""

from __future__ import annotations

import ml_collections

from jaxcap.config import schema
from jaxcap.config.run import Run
from jaxcap.config.training import Optim
from jaxcap.world import student as embedded  # noqa: F401  (registers the synthetic world's SFT target sources)

REGISTRIES = schema.REGISTRIES  # every name a config chooses from, by the field that chooses it (launch's --help)


def optim(
  lr: float,
  *,
  warmup_ratio: float = Optim.warmup_ratio,
  warmup_steps: int = Optim.warmup_steps,
  schedule: str = Optim.schedule,
  weight_decay: float = Optim.weight_decay,
  grad_clip: float = Optim.grad_clip,
  master_update: str = Optim.master_update,
) -> ml_collections.ConfigDict:
  """A phase's optimiser block (jaxcap.config.training.Optim). `master_update` says how updates land on bfloat16
  master weights (jaxcap.train.steps.precision): "exact" (round to nearest; needs model.param_dtype float32 at fine-tuning
  learning rates, where most bfloat16 updates round away) or "stochastic_rounding" (unbiased, for bfloat16 masters)."""
  o = Optim(
    lr=lr,
    warmup_ratio=warmup_ratio,
    warmup_steps=warmup_steps,
    schedule=schedule,
    weight_decay=weight_decay,
    grad_clip=grad_clip,
    master_update=master_update,
  )
  return ml_collections.ConfigDict(o.to_dict())


def base_config() -> ml_collections.ConfigDict:
  """Every field of the run config with its default (jaxcap.config.run.Run): the embedded default (synthetic world,
  tiny student, rule-based judge) that finishes on a laptop CPU."""
  return ml_collections.ConfigDict(schema.defaults())


def real_model_run(
  c: ml_collections.ConfigDict, *, max_new_tokens: int, max_pixels: int = 448 * 448, rl: bool = True
) -> None:
  """The settings every `:paper` variant shares: a real Qwen2.5-VL checkpoint (no embedded SFT warm start),
  float32 master weights and optimizer state with bfloat16 compute (as maxtext's weight_dtype / dtype; bfloat16
  masters lose most AdamW updates at lr 1e-6..1e-5, see jaxcap.train.steps.precision) and full remat, images at their
  native size and aspect within `max_pixels` (448 x 448: at most 256 visual tokens per image, what docs/scale-and-planning.md's
  memory plan assumes), batches grouped by size, and (for RL) an LLM judge fleet over HTTP with no KL term (BalCapRL states none, CapRL's
  released code uses 0; set rl.loss.kl_coef for the CapRL paper's KL)."""
  c.vision_warmup.steps = 0
  c.sft.freeze_vision = False  # the embedded student's recipe; the papers state no frozen tower
  if rl:
    c.sft.steps = 0
    c.judge.kind = "http"
    c.rl.loss.kl_coef = 0.0
  c.sampling.max_new_tokens = max_new_tokens
  c.data.image_size = 0
  c.data.max_pixels = max_pixels
  c.data.group_by_size = 16
  # param_dtype 'auto': float32 masters in full fine-tuning, a LoRA run's frozen base in the checkpoint's bfloat16
  c.model.update(dict(dtype="bfloat16", param_dtype="auto", remat="full", scan_layers=True))


def released_answerer(c: ml_collections.ConfigDict, *, video: bool) -> None:
  """The released CapRL / CapRL++ answerer (`serve_rm.py`): a raw completion prompt with "The answer is"
  pre-filled (the video template on video captions), sampled at temperature 0.6 for at most 10 tokens, and a reply
  naming no letter scored wrong (not re-asked, not masked)."""
  c.judge.answerer.update(
    dict(
      template="caprl_released",
      video_template="caprl_released_video" if video else "",
      temperature=0.6,
      max_tokens=10,
      no_letter="wrong",
    )
  )


def released_plus(c: ml_collections.ConfigDict, *, video: bool) -> None:
  """CapRL++'s released verl recipe (`train_caprl.sh`, `serve_rm.py`): 128 prompts x 8 rollouts a step, actor lr
  1e-5 constant after 20 warm-up steps, up to 4,096 new tokens, seq-mean-token-mean, the rollout's own log-probs as
  the old policy's, verl's PPO clip 0.2 and dual clip 3; reward = QA accuracy (shuffled, cannot-answer F) + 0.2 x
  the length reward (+ 0.2 x the timestamp format on video); the Qwen3-4B-Instruct answerer as released."""
  real_model_run(c, max_new_tokens=4096, max_pixels=448 * 448)
  stage = "video" if video else "image"
  c.name, c.workdir = f"caprl_plus_{stage}", f"runs/caprl_plus_{stage}"
  c.data.prompt = "Please describe this image in detail."  # the rows' own prompt wins (the released video rows')
  c.reward = {
    "caprl": {"weight": 1.0, "preset": "caprl_plus"},
    "caption_length": {"weight": 0.2, "full_until": 2048, "zero_at": 3072},
  }
  if video:
    c.reward["timestamp_format"] = {"weight": 0.2, "min_brackets": 3, "max_minute": 599}
  released_answerer(c, video=video)
  c.rl.update(dict(steps=600, batch_size=128, num_samples=8, micro_batches=32, estimator="rloo"))
  c.rl.recompute_old_logprobs = False
  c.rl.optim = optim(1e-5, warmup_steps=20, schedule="constant")
  c.rl.loss.update(dict(aggregation="seq-mean-token-mean", eps_low=0.2, eps_high=0.2, dual_clip_c=3.0))
  c.sampling.temperature = 1.0


def validate(c: ml_collections.ConfigDict) -> Run:
  """The typed run config, parsed once at the command line's boundary: every module below it takes the frozen
  `Run`. Fails before any compute with every error at once, each naming the field and the fix
  (jaxcap.config.schema.validate: unknown keys, types, ranges, choices, cross-field checks)."""
  return schema.validate(c)
