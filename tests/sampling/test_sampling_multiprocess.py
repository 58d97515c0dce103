"""Two jax.distributed processes (CPU, gloo) sample one global batch: each decodes its own rows' captions from its
own shards (no all-gather of the decode state or log-probs), and the update's arrays derived on device equal the
host path's uploads (both checked in multiprocess_worker.py)."""

import json
import sys
from pathlib import Path

import pytest

from processes import run_processes

pytestmark = pytest.mark.slow  # two processes, each compiling the sampler

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def test_each_process_decodes_its_own_rows(tmp_path):
  worker = [sys.executable, str(HERE / "multiprocess_worker.py")]
  run_processes(lambda i, port: [*worker, str(tmp_path / f"p{i}.json"), str(i), str(port)], count=2, devices=1)
  got = [json.loads((tmp_path / f"p{i}.json").read_text()) for i in range(2)]
  assert [g["first_row"] for g in got] == [0, 2]
  assert [len(g["text"]) for g in got] == [4, 4]  # 2 prompts x G = 2 each: only this process's rows
  assert all(len(t) == 6 for g in got for t in g["tokens"]) and sum(sum(g["lengths"]) for g in got) > 0
