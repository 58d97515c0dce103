"""Real-shape memory (issue 36): random Qwen2.5-VL checkpoints laid out as the Hub's, and where a load's time goes.
Not run by the tests.

    python -m benchmarks.real_shape_memory build --preset qwen2.5-vl-3b --out /data/ckpt/3b   # 6.99 GiB, once
    python -m benchmarks.real_shape_memory profile --preset qwen2.5-vl-3b --layers 2 --vision_depth 4

`build` writes bf16 safetensors in the Hub's shard count and key layout (`model.language_model.*`,
`model.visual.*`, `lm_head.weight` unless tied), model.safetensors.index.json, a config.json with the preset's
values and `dtype: bfloat16`, and a word tokenizer (nothing can be downloaded); an existing complete directory is
kept (cached). `profile` builds a checkpoint of the preset's widths with fewer layers in a temporary directory and
prints load_hf_checkpoint's time by function (cProfile), in the checkpoint's dtype and in float32.

The table against transformers on the same checkpoint (load, one forward, captions, peak RSS; each in a fresh
process) is `benchmarks/real_shape_table.py`; the annotator's memory by phase, `benchmarks/caption_phases.py`.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SHARDS = {"qwen2.5-vl-3b": 4, "qwen2.5-vl-7b": 5}  # as the Hub's Qwen2.5-VL-3B / 7B-Instruct


def hub_tensors(cfg) -> dict[str, tuple[tuple[int, ...], str]]:
  """HF tensor name (the Hub's current layout) -> (shape, layout rule) for every param of `cfg`."""
  import jax
  from flax import nnx

  from jaxcap.checkpoint.hf_layout import hf_name, hf_shape, layer_names, path_name
  from jaxcap.models.qwen25vl import Qwen25VL

  state = nnx.to_pure_dict(nnx.state(nnx.eval_shape(lambda: Qwen25VL(cfg, rngs=nnx.Rngs(0))), nnx.Param))
  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
    template, layout = hf_name(path_name(path))
    stacked = "*" in template
    shape = hf_shape(leaf.shape[1:] if stacked else leaf.shape, layout, cfg)
    for name in layer_names(template, leaf.shape[0] if stacked else 1):
      if name.startswith("visual."):
        name = "model." + name
      elif name.startswith("model."):
        name = "model.language_model." + name[len("model.") :]
      out[name] = (shape, layout)
  return out


def build_checkpoint(cfg, directory: str | Path, shards: int = 1, seed: int = 0) -> Path:
  """Random bf16 weights (std 0.02, norms 1) of `cfg` in `shards` safetensors files of the Hub's layout."""
  import ml_dtypes
  from safetensors.numpy import save_file

  from jaxcap.processing import word_tokenizer

  directory = Path(directory)
  if (directory / "config.json").exists() and (directory / "model.safetensors.index.json").exists():
    return directory  # built before
  directory.mkdir(parents=True, exist_ok=True)
  rng = np.random.default_rng(seed)
  tensors = hub_tensors(cfg)
  total = sum(int(np.prod(s)) * 2 for s, _ in tensors.values())
  per_shard, weight_map, shard, size, index = -(-total // shards), {}, {}, 0, 0

  def flush():
    nonlocal shard, size, index
    index += 1
    name = f"model-{index:05d}-of-{shards:05d}.safetensors"
    save_file(shard, directory / name, metadata={"format": "pt"})
    weight_map.update({k: name for k in shard})
    shard, size = {}, 0

  for name in sorted(tensors):
    shape, _ = tensors[name]
    if name.endswith("norm.weight") or ".norm" in name or "ln_q" in name:
      value = np.ones(shape, ml_dtypes.bfloat16)
    else:
      value = (rng.standard_normal(shape, np.float32) * 0.02).astype(ml_dtypes.bfloat16)
    shard[name] = value
    size += value.nbytes
    if size >= per_shard and index < shards - 1:
      flush()
  flush()
  shards = index  # fewer when the last shard filled early; the index names the files as written
  (directory / "model.safetensors.index.json").write_text(
    json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
  )
  hf = cfg.to_hf_dict()
  hf["dtype"] = hf["text_config"]["dtype"] = hf["vision_config"]["dtype"] = "bfloat16"
  (directory / "config.json").write_text(json.dumps(hf, indent=2))
  from benchmarks.fixtures import WORDS

  word_tokenizer(WORDS, cfg).save_pretrained(directory)
  return directory


def profile_load(directory: Path, param_dtype=None, top: int = 15) -> float:
  """Seconds of one load_hf_checkpoint, printing the functions taking the most cumulative time."""
  import jax

  from jaxcap.checkpoint import load_hf_checkpoint

  prof = cProfile.Profile()
  start = time.perf_counter()
  prof.enable()
  model = load_hf_checkpoint(directory, param_dtype=param_dtype)
  jax.block_until_ready(jax.tree.leaves(model))
  prof.disable()
  seconds = time.perf_counter() - start
  pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(top)
  return seconds


def preset_config(preset: str, layers: int | None = None, vision_depth: int | None = None):
  """The preset's config, with `layers` decoder layers and `vision_depth` vision blocks when given (same widths)."""
  import jaxcap.models as M

  cfg = M.PRESETS[preset]()
  if layers is not None:
    cfg = cfg.replace(text=cfg.text.__class__(**{**cfg.text.__dict__, "num_hidden_layers": layers}))
  if vision_depth is not None:
    full = tuple(i for i in cfg.vision.fullatt_block_indexes if i < vision_depth) or (vision_depth - 1,)
    vision = {**cfg.vision.__dict__, "depth": vision_depth, "fullatt_block_indexes": full}
    cfg = cfg.replace(vision=cfg.vision.__class__(**vision))
  return cfg


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(prog="python -m benchmarks.real_shape_memory")
  ap.add_argument("command", choices=("build", "profile"))
  ap.add_argument("--preset", default="qwen2.5-vl-3b", choices=sorted(SHARDS))
  ap.add_argument("--out", default=None, help="build: the checkpoint directory")
  ap.add_argument("--layers", type=int, default=None, help="decoder layers (default: the preset's)")
  ap.add_argument("--vision_depth", type=int, default=None, help="vision blocks (default: the preset's)")
  args = ap.parse_args(argv)
  cfg = preset_config(args.preset, args.layers, args.vision_depth)
  if args.command == "build":
    if not args.out:
      ap.error("build needs --out DIR")
    start = time.perf_counter()
    print(build_checkpoint(cfg, args.out, SHARDS[args.preset]), f"{time.perf_counter() - start:.1f} s")
    return 0
  import jax.numpy as jnp

  with tempfile.TemporaryDirectory() as tmp:
    directory = build_checkpoint(cfg, tmp, SHARDS[args.preset])
    size = sum(p.stat().st_size for p in Path(tmp).glob("*.safetensors"))
    print(f"checkpoint: {size / 1024**3:.2f} GiB in bf16, {len(list(Path(tmp).glob('*.safetensors')))} shards")
    for dtype in (None, jnp.float32):
      seconds = profile_load(directory, dtype)
      print(f"load_hf_checkpoint (param_dtype={dtype and jnp.dtype(dtype).name}): {seconds:.2f} s\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
