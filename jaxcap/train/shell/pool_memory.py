"""The paged rollout engine's page pool against one device, before any compute (`check_pool_memory`): an
accelerator's `memory_stats()`, the host's memory on CPU, for the embedded student too. The pool is sized from the
config (`rollout.pages`, or the slots at their longest), with a hybrid decoder's linear states, beside the model the
engine decodes with; one too large is refused naming the knob and what would fit."""

from __future__ import annotations

import os

import jax
import numpy as np

from jaxcap.config.cli import ConfigError
from jaxcap.config.run import Run
from jaxcap.host_memory import BUDGET, available_memory
from jaxcap.sampling.footprint import param_sizes
from jaxcap.sampling.page_budget import own_pages, prompt_pages
from jaxcap.train.shell.memory_check import image_patches, size


def page_pool(config: Run, cfg) -> tuple[int, int, int]:
  """(pages, bytes per page, pages a slot holds at its worst) of one paged engine's pool, at least: `rollout.pages`,
  or with 0 (as many as a call uses) every slot at its worst, its prompt's pages and its own for
  `sampling.max_new_tokens` (`page_budget.pool_pages` less the step's prompts, which the engine adds). The prompt is
  the largest image's tokens and ~64 of text, as `train_footprint` counts it."""
  r, t = config.rollout, cfg.text
  z, new = int(r.page_size), int(config.sampling.max_new_tokens)
  prompt = image_patches(config, cfg) // cfg.vision.spatial_merge_size**2 + 64
  worst = int(prompt_pages(prompt, z) + own_pages(new, z, prompt % z))
  page = 2 * t.kv_layers * t.num_key_value_heads * z * t.head_dim * np.dtype(cfg.dtype).itemsize
  return (int(r.pages) or 1 + int(r.slots) * worst), page, worst


def device_memory(device=None) -> tuple[int, str] | None:
  """(bytes one device can hold, where the figure comes from): `JAXCAP_MEMORY_BUDGET` when set; an accelerator's
  `memory_stats()['bytes_limit']`; on CPU the host's available memory (`host_memory.available_memory`); None where
  nothing can be read or the budget is 'off'."""
  device = jax.local_devices()[0] if device is None else device
  if os.environ.get(BUDGET) or device.platform == "cpu":
    return available_memory()
  stats = device.memory_stats() or {}
  if stats.get("bytes_limit"):
    return int(stats["bytes_limit"]), f"{device.device_kind}'s memory_stats() bytes_limit"
  return None


def check_pool_memory(config: Run, cfg, available: tuple[int, str] | None = None) -> None:
  """Raises ConfigError, before any compute, when the paged engine's page pool (and the model it decodes with,
  whole on each engine's device in the compute dtype) cannot fit one device: a pool sized for a long
  `sampling.max_new_tokens` within the model's context, many `rollout.slots` or a large `rollout.pages` otherwise
  died on its allocation after SFT. One line naming the knob and what would fit. `available`: (bytes, source),
  default `device_memory()`."""
  if config.rollout.engine != "paged" or not config.rl.steps:
    return
  available = device_memory() if available is None else available
  if available is None:
    return
  budget, source = available
  pages, page, worst = page_pool(config, cfg)
  r, new = config.rollout, int(config.sampling.max_new_tokens)
  # a hybrid decoder's linear states (Qwen3.5): each slot's, and a store row per prompt in flight (at least one per
  # slot and one more: `page_budget.state_rows`)
  state = cfg.text.recurrent_bytes(cfg.dtype)
  states = (2 * int(r.slots) + 1) * state
  # the model beside the pool (not a QLoRA base's, whose decode layout this does not count): a lower bound
  model = 0 if str(config.model.lora.weight_qtype) else sum(int(np.prod(s)) for _, s in param_sizes(cfg))
  model *= np.dtype(cfg.dtype).itemsize
  if model + pages * page + states <= budget:
    return
  what = f"the paged engine's page pool needs at least {size(pages * page)} per device ({pages} pages of {r.page_size} tokens"
  if r.pages:
    room = max(0, budget - model - states) // page  # pages that fit beside the model (and the linear states)
    fix = f"lower rollout.pages (now {r.pages}; about {room} fit)"
  else:
    what += f": rollout.slots={r.slots} x {worst} pages for a prompt and sampling.max_new_tokens={new}"
    fit = max(0, (budget - model - page - state) // (worst * page + 2 * state))
    fix = f"lower rollout.slots (now {r.slots}; {fit} fit) or sampling.max_new_tokens (now {new})"
  if states:
    what += f"; and {size(states)} of linear states, {size(state)} per slot and per prompt in flight"
  raise ConfigError(
    f"{what}) beside the model's {size(model)} in {np.dtype(cfg.dtype).name}, but a device holds {size(budget)} "
    f"({source}); {fix}, or use rollout.engine='static'"
  )
