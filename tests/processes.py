"""Running tests' subprocesses: CPU environments with N virtual devices, and groups of jax.distributed processes
on one machine (gloo collectives). A helper module, not a test file."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path
from typing import Callable, Sequence

ROOT = Path(__file__).resolve().parents[1]


def cpu_env(devices: int) -> dict[str, str]:
  """The environment of a CPU-only jax process with `devices` virtual devices; jaxcap and tests/ importable."""
  return {
    **os.environ,
    "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
    "JAX_PLATFORMS": "cpu",
    "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo",
    "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]),
  }


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def run_processes(
  command: Callable[[int, int], Sequence[str]], count: int, devices: int, timeout: float = 600
) -> list[str]:
  """Runs `command(process_id, coordinator_port)` as `count` processes of `devices` CPU devices each, waits for
  all, asserts they exited 0 (showing the tail of each one's output) and returns their outputs."""
  port = free_port()
  procs = [
    subprocess.Popen(
      list(command(i, port)),
      env=cpu_env(devices),
      cwd=ROOT,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
    )
    for i in range(count)
  ]
  outs = [p.communicate(timeout=timeout)[0] for p in procs]
  assert all(p.returncode == 0 for p in procs), "\n".join(o[-2000:] for o in outs)
  return outs
