"""Two jax.distributed processes (CPU, gloo) of 2 devices each sample one global batch of 4 image prompts, 2 per
process, with both samplers (checked in multiprocess_worker.py). The static sampler: each process decodes its own
rows' captions from its own shards (no all-gather of the decode state or log-probs), and the update's arrays
derived on device equal the host path's uploads. The paged engine: the global arrays' blocks are the processes'
rows, and their tokens the one-device engine's on all 4 prompts (process i's prompt b is prompt 2i + b of the
global batch, whose draws it keys)."""

import json
import sys
from pathlib import Path

import pytest

from multiprocess_worker import write_images
from processes import run_processes

pytestmark = pytest.mark.slow  # two processes, each compiling both samplers

HERE = Path(__file__).resolve().parent


def test_each_process_decodes_its_own_rows(tmp_path):
  images = str(tmp_path / "images")
  write_images(images)
  worker = [sys.executable, str(HERE / "multiprocess_worker.py")]
  run_processes(lambda i, port: [*worker, str(tmp_path / f"p{i}.json"), str(i), str(port), images], count=2, devices=2)
  got = [json.loads((tmp_path / f"p{i}.json").read_text()) for i in range(2)]
  static = [g["static"] for g in got]
  assert [g["first_row"] for g in static] == [0, 2]
  assert [len(g["text"]) for g in static] == [4, 4]  # 2 prompts x G = 2 each: only this process's rows
  assert all(len(t) == 6 for g in static for t in g["tokens"]) and sum(sum(g["lengths"]) for g in static) > 0
  paged = [g["paged"] for g in got]
  assert [len(g["text"]) for g in paged] == [4, 4]
  for name in ("greedy", "sampled"):
    assert all(g[name]["same_tokens"] and g[name]["same_lengths"] for g in paged), name
  assert paged[0]["sampled"]["tokens"] != paged[0]["greedy"]["tokens"]
