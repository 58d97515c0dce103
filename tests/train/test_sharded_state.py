"""The whole train state of a loaded HF checkpoint is sharded by the params' rules, created in place on one
process or across two (jax.distributed over gloo on CPU), and 2 processes x 4 devices take the same steps as
1 process x 8."""

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from hf_reference import save_tiny_checkpoint
from processes import cpu_env, run_command, run_processes
from jaxcap.models.qwen25vl_presets import tiny

pytestmark = pytest.mark.slow  # three subprocesses, each compiling a train step

WORKER = Path(__file__).with_name("sharded_state_worker.py")
ROOT = Path(__file__).resolve().parents[2]


def test_two_processes_shard_the_state_and_step_like_one(tmp_path):
  # text width 256 / MLP 1280 / vocab 2048: the big matrices, both moments and the reference copy are >= 1 MiB
  cfg = tiny(vocab_size=2048)
  cfg = cfg.replace(
    text=dataclasses.replace(
      cfg.text, hidden_size=256, intermediate_size=1280, num_attention_heads=16, num_key_value_heads=4
    ),
    vision=dataclasses.replace(cfg.vision, out_hidden_size=256),
  )
  save_tiny_checkpoint(cfg, 0, tmp_path / "ckpt")
  run_command([sys.executable, str(WORKER), str(tmp_path / "ckpt"), str(tmp_path / "one.json")], env=cpu_env(8))
  run_processes(
    lambda i, port: [
      sys.executable,
      str(WORKER),
      str(tmp_path / "ckpt"),
      str(tmp_path / "two.json"),
      str(i),
      "2",
      str(port),
    ],
    count=2,
    devices=4,
  )
  one, two = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("one", "two"))
  assert (one["processes"], one["devices"], two["processes"], two["devices"]) == (1, 8, 2, 8)
  for r in (one, two):
    assert r["replicated_over_1mib"] == []
    assert r["largest_leaf_bytes"] >= 2 * 2**20  # the test would be empty without big leaves
    assert r["largest_leaf_bytes_per_device"] <= r["largest_leaf_bytes"] / 4
    assert r["moment_leaves_sharded"] > 0
  assert two["spans_processes"] is True
  assert len(one["losses"]) == 2 and one["losses"][0] != one["losses"][1]
  for (l1, g1), (l2, g2) in zip(one["losses"], two["losses"], strict=True):
    assert abs(l2 - l1) <= 1e-5 * abs(l1) and abs(g2 - g1) <= 1e-4 * abs(g1)
  assert one["param_sums"].keys() == two["param_sums"].keys() and one["param_sums"]
  for k, v in one["param_sums"].items():
    assert abs(two["param_sums"][k] - v) <= 1e-5 * abs(v), k
