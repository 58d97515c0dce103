"""A 2-process jax.distributed run (CPU, gloo collectives) gives the same losses as a 1-process run with the
same global batch: SFT steps on the full embedded base, then RL steps on LoRA adapters with the KL to the base
(rollouts sampled across both processes, rewards judged per process, advantages and the loss over the global batch;
a small entropy bonus keeps the RL loss non-zero while the tiny student's rewards are still flat). RL is one-step
off-policy (rl.max_staleness=1): both processes queue the same rounds (a process out of step would hang the
next collective), so RL step 1 is the on-policy step and step 2 trains on the round queued during step 1. A
full-parameter RL step over two processes is tests/train/test_sharded_state.py's."""

import json
from pathlib import Path

import pytest

from processes import cpu_env, launch, launch_processes, tiny_run

pytestmark = pytest.mark.slow  # launches training runs in subprocesses

# 3 SFT + 2 RL steps on 16 scenes; the batch sizes are the test's (global vs per process)
COMMON = tiny_run(
  {
    "sft.steps": 3,
    "sft.batch_size": None,
    "rl.batch_size": None,
    "rl.loss.entropy_coef": 0.01,
    "world.train_scenes": 16,
    "eval.num_images": 0,
    "checkpoint.every": 2,
    # the embedded vision warm-up trains on replicated batches: nothing of it differs between the layouts
    "vision_warmup.steps": 0,
    "vision_warmup.batch_size": None,
  }
)


def _losses(workdir):
  rows = [json.loads(line) for line in (Path(workdir) / "metrics.jsonl").read_text().splitlines()]
  return [(r["phase"], r["step"], r["loss"], r["grad_norm"]) for r in rows if "loss" in r]


# SFT trains the embedded base (adapters held), RL the adapters off-policy with the KL to the base (adapters off);
# two SFT steps move the base off its start (the KL is then non-zero) and keep the training processes short
RUN = [
  *COMMON,
  "--config.model.lora.rank=4",
  "--config.rl.loss.kl_coef=0.05",
  "--config.sft.steps=2",
  "--config.rl.max_staleness=1",
]


def _staleness(workdir):
  rows = [json.loads(line) for line in (Path(workdir) / "metrics.jsonl").read_text().splitlines()]
  return [(r["step"], r["async/staleness"]) for r in rows if r["phase"] == "rl" and "loss" in r]


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_5"])
def test_two_processes_match_one(tmp_path, family):
  """Either decoder: the default student's, and Qwen3.5's hybrid one (its linear layers' states sharded by batch)."""
  run = [*RUN, f"--config.model.family={family}"]
  if family == "qwen3_5":  # one linear-attention layer and one full-attention layer
    run.append("--config.model.student.text_layers=2")
  launch(
    "caprl", *run, "--config.sft.batch_size=4", "--config.rl.batch_size=4", workdir=tmp_path / "one", env=cpu_env(2)
  )
  per_process = ["--config.sft.batch_size=2", "--config.rl.batch_size=2"]
  launch_processes("caprl", *run, *per_process, workdir=tmp_path / "two")
  got, want = _losses(tmp_path / "two"), _losses(tmp_path / "one")
  assert [(p, s) for p, s, *_ in got] == [("sft", 1), ("sft", 2), ("rl", 1), ("rl", 2)]
  assert all(g > 0 for *_, g in got)
  assert [(p, s) for p, s, *_ in want] == [(p, s) for p, s, *_ in got]  # same rows in both runs, in order
  for (_, _, l2, g2), (_, _, l1, g1) in zip(got, want, strict=True):
    assert abs(l2 - l1) <= 1e-5 * abs(l1) and abs(g2 - g1) <= 1e-4 * abs(g1)
  # each step's metrics logged once, with its staleness
  assert _staleness(tmp_path / "two") == _staleness(tmp_path / "one") == [(1, 0.0), (2, 1.0)]
