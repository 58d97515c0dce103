"""Shared tiny checkpoints and prompts for the sampling tests (a helper module, not a test file)."""

from __future__ import annotations

import numpy as np

import jaxcap.models as M
from jaxcap.checkpoint import load_hf_checkpoint
from jaxcap.processing import Processor
from hf_reference import hf_inputs, save_tiny_checkpoint


def image(seed: int, h: int, w: int) -> np.ndarray:
  return (np.random.RandomState(seed).rand(h, w, 3) * 255).astype(np.uint8)


def user(*items) -> list[dict]:
  content = [
    {"type": "image", "image": it} if isinstance(it, np.ndarray) else {"type": "text", "text": it} for it in items
  ]
  return [{"role": "user", "content": content}]


PADDED_BATCH = [
  user(image(5, 56, 56), "describe the image ."),
  user(image(6, 112, 140), "what colour is the large triangle on the top left ?"),
  user("a red square"),
]
TWO_IMAGES = [user(image(3, 56, 112), "and", image(4, 112, 84), "describe .")]


def tiny_checkpoint(directory, seed: int):
  """(transformers reference, jaxcap model, processor) sharing random weights."""
  cfg = M.tiny()
  ref = save_tiny_checkpoint(cfg, seed, directory)
  return ref, load_hf_checkpoint(directory), Processor.from_pretrained(directory)


def hf_greedy(ref, proc, conversations, stop_ids, max_new_tokens: int) -> np.ndarray:
  """transformers' greedy `generate` on `conversations` (left-padded): the new tokens int [B, <= max_new_tokens]
  (HF stops once every row has)."""
  import torch

  batch = proc(conversations, padding_side="left")
  with torch.no_grad():
    out = ref.generate(
      **hf_inputs(batch, proc.cfg),
      do_sample=False,
      max_new_tokens=max_new_tokens,
      eos_token_id=list(stop_ids),
      pad_token_id=proc.tokenizer.pad_token_id,
    )
  return out[:, batch.input_ids.shape[1] :].numpy()
