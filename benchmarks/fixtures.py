"""What the benchmarks build their cases from: random-init `transformers` Qwen2.5-VL references saved as tiny
checkpoints and loaded into jaxcap, one-image prompts, and run configs for `jaxcap.train.steps.programs`.

torch and transformers are imported only by the helpers that need them, so GPU/TPU benchmarks without them can
use the rest."""

from __future__ import annotations

import dataclasses

import numpy as np

WORDS = (
  "describe the image in detail . a red blue green square circle triangle on left right top bottom of "
  "and with is there are two three small large what colour shape"
).split()


# ---------------------------------------------------------------------------------------------- run configs
def run_config(
  phase: str | None = None, lr: float = 1e-5, steps: int = 1000, max_new_tokens: int | None = None, **sampling
):
  """`jaxcap.config_files.base_config()` set up as the benchmarks time a run's programs. `phase` ("sft" or "rl"):
  its optimizer is AdamW at a constant `lr` for `steps` updates, no warm-up, no weight decay, global-norm clip 1.0,
  nothing frozen, exact master updates; RL also gets the GRPO estimator and `PolicyLossConfig`'s default loss (clip
  0.2 both sides, dual clip 3, token-mean, no KL or entropy term, so no reference policy). Sampling: temperature 1,
  no top-k / top-p, unless `sampling` (temperature, top_p, top_k) says otherwise; `max_new_tokens` is the sampling
  budget and so the loss's Dr.GRPO constant."""
  from jaxcap.rl import PolicyLossConfig
  from jaxcap.config_files import base_config

  c = base_config()
  c.sampling.update(dict(temperature=1.0, top_p=1.0, top_k=0) | sampling)
  if max_new_tokens is not None:
    c.sampling.max_new_tokens = max_new_tokens
  if phase is None:
    return c
  p = c[phase]
  p.steps = steps
  p.freeze_vision = False
  p.optim.update(
    dict(
      lr=lr,
      schedule="constant",
      warmup_ratio=0.0,
      warmup_steps=0,
      weight_decay=0.0,
      b1=0.9,
      b2=0.999,
      eps=1e-8,
      grad_clip=1.0,
      master_update="exact",
    )
  )
  if phase == "rl":
    c.rl.estimator = "grpo"
    # plain PPO, named: PolicyLossConfig's defaults are the run's (clip-higher 0.28, KL 0.05), which would add a
    # reference policy's log-prob pass to every timed update
    plain = PolicyLossConfig(eps_low=0.2, eps_high=0.2, dual_clip_c=3.0, kl_coef=0.0, entropy_coef=0.0)
    c.rl.loss.update({f.name: getattr(plain, f.name) for f in dataclasses.fields(plain) if f.name in c.rl.loss})
  return c


# ---------------------------------------------------------------------------------------------- inputs
def image_conversations(count: int, side: int, rng: np.random.RandomState) -> list:
  """`count` one-image prompts with random `side` x `side` images."""
  return sized_conversations([(side, side)] * count, rng)


def sized_conversations(sizes, rng: np.random.RandomState) -> list:
  """One one-image prompt per (height, width) in `sizes` (pixels; an int is a square), each a random image."""
  return [
    [
      {
        "role": "user",
        "content": [
          {"type": "image", "image": (rng.rand(*((s, s) if np.isscalar(s) else s), 3) * 255).astype(np.uint8)},
          {"type": "text", "text": "describe the image in detail ."},
        ],
      }
    ]
    for s in sizes
  ]


def image_batch(cfg, count: int, side: int, seed: int):
  """(a `Processor` over a word tokenizer of `WORDS`, the left-padded `ModelInputs` of `count` one-image prompts
  with random `side` x `side` images drawn from `RandomState(seed)`)."""
  from jaxcap.processing import Processor, word_tokenizer

  processor = Processor(word_tokenizer(WORDS, cfg), cfg)
  return processor, processor(image_conversations(count, side, np.random.RandomState(seed)), padding_side="left")


# ---------------------------------------------------------------------------------------------- references
def hf_model(cfg, seed: int):
  """A random-init reference model (f32, eager attention) with non-trivial norm weights and biases."""
  import torch
  import transformers

  torch.manual_seed(seed)
  hc = transformers.Qwen2_5_VLConfig(**cfg.to_hf_dict())
  hc._attn_implementation = "eager"
  model = transformers.Qwen2_5_VLForConditionalGeneration(hc).float().eval()
  with torch.no_grad():  # HF inits norms to 1 and biases to 0; perturb them so every param matters
    for name, p in model.named_parameters():
      if name.endswith("norm.weight") or "norm1" in name or "norm2" in name or "ln_q" in name:
        p.add_(0.1 * torch.randn_like(p))
      elif name.endswith("bias"):
        p.add_(0.02 * torch.randn_like(p))
  return model


def save_tiny_checkpoint(cfg, seed: int, directory):
  """`hf_model(cfg, seed)` saved to `directory` with a word tokenizer over `WORDS`; returns the model."""
  from jaxcap.processing import word_tokenizer

  model = hf_model(cfg, seed)
  model.save_pretrained(directory)
  word_tokenizer(WORDS, cfg).save_pretrained(directory)
  return model


def hf_inputs(batch, cfg) -> dict:
  """Torch kwargs for the reference forward from a jaxcap `ModelInputs`."""
  import torch

  ids = torch.as_tensor(batch.input_ids, dtype=torch.long)
  types = torch.zeros_like(ids, dtype=torch.int)
  types[ids == cfg.image_token_id] = 1
  types[ids == cfg.video_token_id] = 2
  kw = dict(
    input_ids=ids, attention_mask=torch.as_tensor(batch.attention_mask, dtype=torch.long), mm_token_type_ids=types
  )
  if batch.image_grid_thw is not None:
    n = int(np.prod(batch.image_grid_thw, -1).sum())
    kw["pixel_values"] = torch.as_tensor(batch.pixel_values[:n])
    kw["image_grid_thw"] = torch.as_tensor(batch.image_grid_thw)
  if batch.video_grid_thw is not None:
    n = int(np.prod(batch.image_grid_thw, -1).sum()) if batch.image_grid_thw is not None else 0
    kw["pixel_values_videos"] = torch.as_tensor(batch.pixel_values[n:])
    kw["video_grid_thw"] = torch.as_tensor(batch.video_grid_thw)
    kw["second_per_grid_ts"] = torch.as_tensor(batch.second_per_grid_ts)
  return kw


def paired_models(cfg, seed: int = 0, **load_kw):
  """(transformers model with SDPA attention, the same weights loaded by jaxcap, the processor): the HF model is
  saved to a temporary checkpoint and read back through `load_hf_checkpoint`."""
  import tempfile

  from jaxcap.checkpoint import load_hf_checkpoint
  from jaxcap.processing import Processor

  with tempfile.TemporaryDirectory() as d:
    ref = save_tiny_checkpoint(cfg, seed, d)
    ref.set_attn_implementation("sdpa")  # the fastest CPU path transformers offers
    return ref, load_hf_checkpoint(d, **load_kw), Processor.from_pretrained(d)
