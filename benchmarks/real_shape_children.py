"""The two child processes of `benchmarks.real_shape_table` (`--child jaxcap|transformers`): each loads the
checkpoint, runs one forward of the first image + the annotator's prompt (transformers: optionally greedy
`generate` too) and prints one JSON line per phase (seconds, peak RssAnon within it, GiB)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from benchmarks.caption_phases import GIB, Poller


class Timeline:
  """A child's phases: one JSON line each, {phase, s, peak_anon} (peak RssAnon within the phase, GiB)."""

  def __init__(self):
    self.poller, self.last = Poller(), time.perf_counter()

  def done(self, phase: str, **extra):
    now = time.perf_counter()
    line = {"phase": phase, "s": round(now - self.last, 2), "peak_anon": round(self.poller.mark() / GIB, 2)}
    print(json.dumps(line | extra), flush=True)
    self.last = time.perf_counter()


def conversations(paths: list[Path]) -> list:
  from PIL import Image

  from jaxcap.caption import DEFAULT_PROMPT

  return [
    [
      {
        "role": "user",
        "content": [{"type": "image", "image": Image.open(p).convert("RGB")}, {"type": "text", "text": DEFAULT_PROMPT}],
      }
    ]
    for p in paths
  ]


def top10(logits) -> list[int]:
  import numpy as np

  return [int(i) for i in np.argsort(-np.asarray(logits, np.float32))[:10]]


def jaxcap_child(directory: Path, paths: list[Path]) -> None:
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from jaxcap.checkpoint import load_hf_checkpoint
  from jaxcap.models.inference_graph import unrolled_on_cpu
  from jaxcap.processing import Processor

  t = Timeline()
  model = load_hf_checkpoint(directory)
  graphdef, state = nnx.split(model)
  del model
  jax.block_until_ready(jax.tree.leaves(state))
  t.done("load", params_gib=round(sum(x.nbytes for x in jax.tree.leaves(state)) / GIB, 2))
  batch = Processor.from_pretrained(directory)(conversations(paths[:1]))
  args = (jnp.asarray(batch.input_ids), jnp.asarray(batch.positions), jnp.asarray(batch.attention_mask), batch.vision())
  graphdef = unrolled_on_cpu(graphdef, state)  # as jaxcap's inference paths run a 16-bit model on CPU
  forward = jax.jit(lambda state, *a: nnx.merge(graphdef, state)(*a)[0][:, -1])
  jax.block_until_ready(forward(state, *args))
  t.done("forward (compile + run)", tokens=int(batch.input_ids.shape[1]))
  logits = forward(state, *args)
  jax.block_until_ready(logits)
  t.done("forward", top10=top10(logits[0]))


def transformers_child(directory: Path, paths: list[Path], max_new_tokens: int, generate: bool) -> None:
  import torch
  import transformers

  from benchmarks.fixtures import hf_inputs
  from jaxcap.checkpoint import read_config
  from jaxcap.processing import Processor

  t = Timeline()
  cfg = read_config(directory)
  dtype = getattr(torch, json.loads((directory / "config.json").read_text()).get("dtype", "float32"))
  model = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(directory, dtype=dtype).eval()
  t.done("load")
  processor = Processor.from_pretrained(directory)
  kw = hf_inputs(processor(conversations(paths[:1])), cfg)
  with torch.no_grad():
    logits = model(**kw).logits[0, -1].float().numpy()
    t.done("forward", tokens=int(kw["input_ids"].shape[1]), top10=top10(logits))
    if not generate:
      return
    for i in range(0, len(paths), 2):  # same-size images: no padding, so generate's left-padding rule is moot
      kw = hf_inputs(processor(conversations(paths[i : i + 2])), cfg)
      model.generate(**kw, max_new_tokens=max_new_tokens, do_sample=False)
    t.done("generate", images=len(paths))
