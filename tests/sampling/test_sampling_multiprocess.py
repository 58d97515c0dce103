"""Two jax.distributed processes (CPU, gloo) sample one global batch: each decodes its own rows' captions from its
own shards (no all-gather of the decode state or log-probs), and the update's arrays derived on device equal the
host path's uploads (both checked in multiprocess_worker.py)."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # two processes, each compiling the sampler

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _env(devices):
  return {
    **os.environ,
    "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
    "JAX_PLATFORMS": "cpu",
    "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo",
    "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
  }


def test_each_process_decodes_its_own_rows(tmp_path):
  worker = [sys.executable, str(HERE / "multiprocess_worker.py")]
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  procs = [
    subprocess.Popen(
      [*worker, str(tmp_path / f"p{i}.json"), str(i), str(port)],
      env=_env(1),
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
    )
    for i in range(2)
  ]
  outs = [p.communicate(timeout=600)[0] for p in procs]
  assert all(p.returncode == 0 for p in procs), outs[0][-3000:] + outs[1][-3000:]
  got = [json.loads((tmp_path / f"p{i}.json").read_text()) for i in range(2)]
  assert [g["first_row"] for g in got] == [0, 2]
  assert [len(g["text"]) for g in got] == [4, 4]  # 2 prompts x G = 2 each: only this process's rows
  assert all(len(t) == 6 for g in got for t in g["tokens"]) and sum(sum(g["lengths"]) for g in got) > 0
