"""The main job on images of many native sizes (`data.image_size=0`, steps grouped by size): it trains through SFT,
RL and evaluation, and compiles one program per bucket, a handful, not one per combination of sizes."""

import collections
import json

import pytest
from PIL import Image

from jaxcap.config_files import base_config
from jaxcap.world.student import build_world_manifests
from processes import SMALL, compiles, cpu_env, launch, tiny_run

pytestmark = pytest.mark.slow  # a training run in a subprocess

# 6 SFT + 6 RL steps, a checkpoint and a held-out evaluation every 2 RL steps
RUN = tiny_run({"sft.steps": 6}, base=SMALL)
SIZES = [(84, 84), (84, 112), (112, 84), (56, 112), (112, 56), (56, 140)]  # 32 .. 48 patches, 6 aspect ratios


def test_native_mixed_sizes_train_with_few_programs(tmp_path):
  config = base_config()
  config.world.train_scenes, config.world.eval_scenes = SMALL["world.train_scenes"], SMALL["world.eval_scenes"]
  train, heldout = build_world_manifests(config, tmp_path)
  sizes = collections.Counter()
  for manifest in (train, heldout):
    for i, line in enumerate(manifest.read_text().splitlines()):
      path = manifest.parent / json.loads(line)["image"]
      h, w = SIZES[i % len(SIZES)]
      with Image.open(path) as im:
        im.convert("RGB").resize((w, h)).save(path)
      sizes[(h, w)] += 1
  assert len(sizes) == len(SIZES)
  out = launch("caprl", *RUN, "--config.data.image_size=0", workdir=tmp_path, env=cpu_env(1, JAX_LOG_COMPILES="1"))
  by_name = collections.Counter(name for name, _ in compiles(out.stderr))
  programs = {k: by_name[k] for k in ("sft_step", "rl_step", "sequence_logprobs", "prefill", "decode")}
  print("programs compiled:", programs)
  assert all(n >= 1 for n in programs.values()), programs
  # 6 sizes, mixed anew every step of 2 x 6 steps and 4 evaluations: a few buckets each, not one per step
  assert max(programs.values()) <= 4, programs
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert 0 <= summary["rl_end"]["eval/qa_accuracy"] <= 1 and 0 <= summary["sft_end"]["eval/qa_accuracy"] <= 1
