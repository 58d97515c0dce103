"""Where `jaxcap.caption`'s host memory goes, phase by phase (issue 36). Not run by the tests.

    python -m benchmarks.caption_phases --checkpoint /work/ckpt/3b                       # the full checkpoint
    python -m benchmarks.caption_phases --preset qwen2.5-vl-3b --layers 4 --vision_depth 8  # widths, fewer layers

Runs the annotator's steps in this process, in its order and with its settings (the checkpoint's dtype, an owning
`Sampler`, 2 images of 448x336, greedy, `--max_new_tokens` tokens), each compile split from its run
(`lower().compile()`), while a thread polls /proc/self/status every 20 ms. Prints one line per phase: the peak
RssAnon during it and RssAnon / RssFile at its end, the bytes of live jax arrays at its end, and for a compile
the program's `memory_analysis()` (arguments, outputs, temporaries). `--trim` calls glibc's malloc_trim(0) after
each phase (what the retained heap costs); `--malloc system` keeps glibc's defaults (no `retain_on_cpu`).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

GIB = 1024**3


def status() -> dict[str, int]:
  """RssAnon / RssFile / VmHWM of this process, bytes."""
  out = {}
  for line in open("/proc/self/status"):
    key = line.split(":")[0]
    if key in ("RssAnon", "RssFile", "VmHWM"):
      out[key] = int(line.split()[1]) * 1024
  return out


class Poller:
  """Peak RssAnon since the last `mark`, from a thread polling every `every` seconds."""

  def __init__(self, every: float = 0.02):
    self.peak, self.every, self._stop = 0, every, False
    self.thread = threading.Thread(target=self._run, daemon=True)
    self.thread.start()

  def _run(self):
    while not self._stop:
      self.peak = max(self.peak, status()["RssAnon"])
      time.sleep(self.every)

  def mark(self) -> int:
    peak, self.peak = max(self.peak, status()["RssAnon"]), status()["RssAnon"]
    return peak


def live_bytes() -> int:
  import jax

  return sum(a.nbytes for a in jax.live_arrays())


class Phases:
  """Prints a line per phase: peak / end RssAnon, RssFile, live arrays; optionally trims the heap after each."""

  def __init__(self, trim: bool):
    self.poller, self.trim, self.start = Poller(), trim, time.perf_counter()
    self.libc = ctypes.CDLL("libc.so.6") if trim else None
    self.peak = 0
    print(f"{'phase':<28} {'s':>7} {'peak anon':>10} {'anon':>7} {'file':>7} {'live':>7}  (GiB)", flush=True)

  def done(self, name: str, extra: str = ""):
    peak = self.poller.mark()
    self.peak = max(self.peak, peak)
    s = status()
    g = lambda n: f"{n / GIB:.2f}"
    line = f"{name:<28} {time.perf_counter() - self.start:7.1f} {g(peak):>10} {g(s['RssAnon']):>7}"
    print(f"{line} {g(s['RssFile']):>7} {g(live_bytes()):>7}  {extra}", flush=True)
    if self.trim:
      self.libc.malloc_trim(0)
      print(f"{'  after malloc_trim':<28} {'':>7} {'':>10} {g(status()['RssAnon']):>7}", flush=True)
      self.poller.mark()


def analysis(compiled) -> str:
  m = compiled.memory_analysis()
  g = lambda n: f"{n / GIB:.2f}"
  return f"program: args {g(m.argument_size_in_bytes)} out {g(m.output_size_in_bytes)} temp {g(m.temp_size_in_bytes)}"


def images(directory: Path, n: int) -> list[Path]:
  import numpy as np
  from PIL import Image

  rng = np.random.RandomState(0)
  paths = []
  for i in range(n):
    paths.append(directory / f"img{i}.png")
    Image.fromarray((rng.rand(336, 448, 3) * 255).astype(np.uint8)).save(paths[-1])
  return paths


def run(args) -> None:
  import jax
  from PIL import Image

  from jaxcap.caption import DEFAULT_PROMPT
  from jaxcap.checkpoint import checkpoint_dtype, load_hf_checkpoint
  from jaxcap.processing import Processor
  from jaxcap.sampling import Sampler, SamplingConfig
  from jaxcap.sampling.footprint import sampling_footprint
  from jaxcap.sampling.generate import decode_jit, prefill_jit, static_arguments

  phases = Phases(args.trim)
  jax.numpy.zeros(1).block_until_ready()
  phases.done("runtime started")
  directory = Path(args.checkpoint)
  processor = Processor.from_pretrained(directory)
  sampling = SamplingConfig(max_new_tokens=args.max_new_tokens)
  dtype = checkpoint_dtype(directory, args.dtype)
  with tempfile.TemporaryDirectory() as tmp:
    media = [{"type": "image", "image": Image.open(p).convert("RGB")} for p in images(Path(tmp), args.batch_size)]
    conversations = [[{"role": "user", "content": [m, {"type": "text", "text": DEFAULT_PROMPT}]}] for m in media]
    model = load_hf_checkpoint(directory, param_dtype=dtype, layers_apart=True)  # as the annotator loads
    read = [x for x in jax.tree.leaves(nnx_state(model)) if isinstance(x, jax.Array)]  # the decoder: still on disk
    jax.block_until_ready(read)
    phases.done("load", f"{sum(x.nbytes for x in read) / GIB:.2f} GiB params (the decoder's layers not yet read)")
    sampler = Sampler(model, processor=processor, sampling=sampling, owns_weights=True)
    del model
    jax.block_until_ready(jax.tree.leaves(sampler.params))
    phases.done("hold for decoding", f"{sum(x.nbytes for x in jax.tree.leaves(sampler.params)) / GIB:.2f} GiB")
    batch = sampler.place(sampler.bucket(conversations))
    phases.done("bucket + place")
  static = static_arguments(sampler.graphdef, sampling, sampler.cfg.eos_token_id, sampler.pad_id)
  key = jax.random.key(0)
  prefill = prefill_jit.lower(sampler.params, batch.prompts, key, num_samples=1, **static).compile()
  phases.done("prefill compile", analysis(prefill))
  state = prefill(sampler.params, batch.prompts, key)
  jax.block_until_ready(state)
  phases.done("prefill run")
  decode = decode_jit.lower(sampler.params, state, **static).compile()
  phases.done("decode compile", analysis(decode))
  state = decode(sampler.params, state)
  jax.block_until_ready(state)
  phases.done("decode run")
  for i in range(1, args.batches):
    state = prefill(sampler.params, batch.prompts, key)
    jax.block_until_ready(state)
    phases.done(f"batch {i + 1}: prefill")
    state = decode(sampler.params, state)
    jax.block_until_ready(state)
    phases.done(f"batch {i + 1}: decode")
  b, t = batch.prompts.input_ids.shape
  patches = batch.prompts.vision.pixel_values.shape[0] // b if batch.prompts.vision is not None else 0
  f = sampling_footprint(sampler.cfg, b, t, args.max_new_tokens, patches)
  print(f"peak RssAnon {phases.peak / GIB:.2f} GiB; estimate {f.describe(jax.numpy.dtype(dtype).name)}", flush=True)


def nnx_state(model):
  from flax import nnx

  return nnx.state(model, nnx.Param)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(prog="python -m benchmarks.caption_phases")
  ap.add_argument("--checkpoint", default=None, help="a checkpoint directory (default: build --preset's, cached)")
  ap.add_argument("--preset", default="qwen2.5-vl-3b")
  ap.add_argument("--layers", type=int, default=None)
  ap.add_argument("--vision_depth", type=int, default=None)
  ap.add_argument("--cache", default="/tmp/jaxcap-real-shape", help="where built checkpoints are kept")
  ap.add_argument("--batch_size", type=int, default=2)
  ap.add_argument("--max_new_tokens", type=int, default=16)
  ap.add_argument("--dtype", default=None)
  ap.add_argument("--batches", type=int, default=3, help="calls on the same batch (the first compiles)")
  ap.add_argument("--trim", action="store_true", help="malloc_trim(0) after each phase")
  ap.add_argument("--malloc", choices=("retain", "system"), default="retain")
  args = ap.parse_args(argv)
  if args.malloc == "system":
    os.environ.setdefault("JAXCAP_HOST_MALLOC", "system")
  from jaxcap.host_memory import retain_on_cpu

  retain_on_cpu()
  print(f"GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '')!r} load average {os.getloadavg()}", flush=True)
  if args.checkpoint is None:
    from benchmarks.real_shape_memory import SHARDS, build_checkpoint, preset_config

    cfg = preset_config(args.preset, args.layers, args.vision_depth)
    name = f"{args.preset}-L{cfg.text.num_hidden_layers}-V{cfg.vision.depth}"
    args.checkpoint = str(build_checkpoint(cfg, Path(args.cache) / name, SHARDS[args.preset]))
  run(args)
  return 0


if __name__ == "__main__":
  sys.exit(main())
