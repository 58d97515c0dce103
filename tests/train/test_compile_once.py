"""A training run compiles each of its programs once: the update steps, the log-prob pass and the sampler's
prefill / decode (one per sampling configuration: RL's and the greedy evaluation's), however many steps,
evaluations and checkpoints it takes."""

import collections
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a training run in a subprocess

ROOT = Path(__file__).resolve().parents[2]
RUN = [
  "--config.sft.steps=6",
  "--config.sft.batch_size=8",
  "--config.rl.steps=6",
  "--config.rl.batch_size=4",
  "--config.rl.num_samples=4",
  "--config.sampling.max_new_tokens=16",
  "--config.sft.max_target_tokens=32",
  "--config.world.train_scenes=32",
  "--config.world.eval_scenes=8",
  "--config.eval.num_images=8",
  "--config.eval.every=2",
  "--config.checkpoint.every=2",
  "--config.model.student.text_layers=1",
  "--config.model.student.vision_depth=1",
  "--config.vision_warmup.steps=2",
  "--config.vision_warmup.batch_size=4",
  "--config.export.hf=False",
]
COMPILING = re.compile(r"Compiling jit\((\w+)\) with global shapes and types (.*)\. Argument mapping")


def launch_logging_compiles(workdir, args) -> str:
  """Runs the main job (`configs/caprl.py`) with `args` in a subprocess, compiling from scratch and logging every
  compilation; asserts it exits 0 and returns its stderr."""
  env = {
    **os.environ,
    "JAX_LOG_COMPILES": "1",
    "JAX_PLATFORMS": "cpu",
    "XLA_FLAGS": "",
    "JAX_COMPILATION_CACHE_DIR": "",
  }
  out = subprocess.run(
    [sys.executable, "-m", "jaxcap.launch", f"--config={ROOT / 'configs' / 'caprl.py'}", f"--config.workdir={workdir}"]
    + list(args),
    env=env,
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=900,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  return out.stderr


def test_each_program_compiles_once(tmp_path):
  stderr = launch_logging_compiles(tmp_path, RUN)
  compiles = COMPILING.findall(stderr)
  by_name = collections.Counter(name for name, _ in compiles)
  want = {"sft_step": 1, "rl_step": 1, "sequence_logprobs": 1, "prefill": 2, "decode": 2}
  assert {k: by_name[k] for k in want} == want, by_name
  # no program of the run is compiled twice for the same arguments (3 evaluations, 6 checkpoints, 2 phases)
  big = [(n, sig) for n, sig in compiles if n in want]
  assert len(set(big)) == len(big)
