"""Helpers that build tiny `transformers` Qwen2.5-VL models offline and run them as the reference."""

from __future__ import annotations

import numpy as np
import torch
import transformers

from jaxcap.models.config import Qwen25VLConfig
from jaxcap.processing import word_tokenizer

WORDS = (
  "describe the image in detail . a red blue green square circle triangle on left right top bottom of "
  "and with is there are two three small large what colour shape"
).split()


def hf_model(cfg: Qwen25VLConfig, seed: int) -> transformers.Qwen2_5_VLForConditionalGeneration:
  """A random-init reference model (f32, eager attention) with non-trivial norm weights and biases."""
  torch.manual_seed(seed)
  hc = transformers.Qwen2_5_VLConfig(**cfg.to_hf_dict())
  hc._attn_implementation = "eager"
  model = transformers.Qwen2_5_VLForConditionalGeneration(hc).float().eval()
  with torch.no_grad():  # HF inits norms to 1 and biases to 0; perturb them so the test sees every param
    for name, p in model.named_parameters():
      if name.endswith("norm.weight") or "norm1" in name or "norm2" in name or "ln_q" in name:
        p.add_(0.1 * torch.randn_like(p))
      elif name.endswith("bias"):
        p.add_(0.02 * torch.randn_like(p))
  return model


def save_tiny_checkpoint(cfg: Qwen25VLConfig, seed: int, directory) -> transformers.PreTrainedModel:
  model = hf_model(cfg, seed)
  model.save_pretrained(directory)
  word_tokenizer(WORDS, cfg).save_pretrained(directory)
  return model


def hf_inputs(batch, cfg: Qwen25VLConfig) -> dict:
  """Torch kwargs for the reference forward from a jaxcap `ModelInputs`."""
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


def paired_models(cfg: Qwen25VLConfig, seed: int = 0, **load_kw):
  """(transformers model with SDPA attention, the same weights loaded by jaxcap, the processor) for benchmarks:
  the HF model is saved to a temporary checkpoint and read back through `load_hf_checkpoint`."""
  import tempfile

  from jaxcap.checkpoint import load_hf_checkpoint
  from jaxcap.processing import Processor

  with tempfile.TemporaryDirectory() as d:
    ref = save_tiny_checkpoint(cfg, seed, d)
    ref.set_attn_implementation("sdpa")  # the fastest CPU path transformers offers
    return ref, load_hf_checkpoint(d, **load_kw), Processor.from_pretrained(d)


def image_conversations(count: int, side: int, rng: np.random.RandomState) -> list:
  """`count` one-image prompts with random `side` x `side` images."""
  return [
    [
      {
        "role": "user",
        "content": [
          {"type": "image", "image": (rng.rand(side, side, 3) * 255).astype(np.uint8)},
          {"type": "text", "text": "describe the image in detail ."},
        ],
      }
    ]
    for _ in range(count)
  ]
