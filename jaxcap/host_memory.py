"""Host memory for XLA:CPU: keep freed buffers in the process instead of handing them back to the kernel.

XLA:CPU allocates each execution's temporary buffer (1.7 GB for the `mid` update step) with malloc on one of its
worker threads and frees it at the end. glibc serves a request that large from a fresh mmap (a thread's arena cannot
hold it) and unmaps it on free, so every call faults every page of it back in: 430k page faults and ~1 s of kernel
time per update step on a 2-core host, ~15% of its CPU time (docs/benchmarks-history.md). With one arena, no mmap and no
trimming, the freed buffer stays in the heap and later calls reuse it with no faults. The cost is host memory: the
process keeps its peak, and as asynchronous dispatch keeps a few calls' buffers alive at once, the heap grows over the
first calls (~20 for a small program) before every request finds a freed buffer. glibc reads these settings
(`GLIBC_TUNABLES`) only when a process starts, so an entry point that runs on CPU re-executes itself once with them.

What the retained heap cannot do is serve two programs of different sizes in turn: an RL step runs its rollouts and
log-prob passes, then the update, whose temporaries are the largest block. The next step's smaller buffers are cut
from the update's freed block (best fit), the next update no longer fits in what is left, and the heap grows by
another one, so resident memory becomes the sum of the programs' peaks instead of the largest (the `mid` shapes, 8
prompts x 8 samples x 64 new tokens: 10.6 GiB against 6.9 GiB with glibc's defaults; at 256 new tokens the kernel
killed the run). Not trimming is not the cause (the same peak with glibc's trim threshold): the holes are between
live blocks, where only malloc_trim reaches. So the RL learner hands the free pages back once a step, before its
update (`release_freed`): each program's buffers are faulted in once a step instead of once a call
(docs/benchmarks-history.md, "Host memory at longer captions").

Set JAXCAP_HOST_MALLOC=system to keep glibc's defaults.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import os
import platform
import re
import sys

# one arena (a thread's arena cannot grow past 64 MB, so big requests would fall back to mmap), no mmap, no trimming
TUNABLES = "glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=1099511627776"
OPT_OUT = "JAXCAP_HOST_MALLOC"
_ACCELERATOR_MODULES = ("libtpu", "jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin", "jax_rocm7_plugin")


def runs_on_cpu(environ) -> bool:
  """Whether JAX will pick its CPU backend, judged before it starts: JAX_PLATFORMS names cpu first, or is unset and
  no accelerator plugin (PJRT plugin entry point, libtpu, CUDA / ROCm plugin) is installed."""
  platforms = environ.get("JAX_PLATFORMS", "").strip()
  if platforms:
    return platforms.split(",")[0].strip() == "cpu"
  if importlib.metadata.entry_points(group="jax_plugins"):
    return False
  return not any(importlib.util.find_spec(m) is not None for m in _ACCELERATOR_MODULES)


def retained_env(environ) -> dict | None:
  """`environ` with the tunables added, or None when nothing is to change: not Linux with glibc, opted out, already
  set (by the user, or by this process's earlier start), or JAX will run on an accelerator."""
  if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
    return None
  if environ.get(OPT_OUT) or "glibc.malloc." in environ.get("GLIBC_TUNABLES", ""):
    return None
  if not runs_on_cpu(environ):
    return None
  tunables = ":".join(t for t in (environ.get("GLIBC_TUNABLES", ""), TUNABLES) if t)
  return {**environ, "GLIBC_TUNABLES": tunables, OPT_OUT: "retain"}


def retain_on_cpu() -> None:
  """Re-executes this command (`sys.orig_argv`) with the tunables when it will run on CPU; returns when nothing is to
  change. Call it first thing in a `__main__` block, before any thread or JAX backend starts."""
  env = retained_env(os.environ)
  if env is not None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, env)


def retained(environ=None) -> bool:
  """Whether this process runs with the retained heap (`retain_on_cpu` re-executed it with the tunables)."""
  return (os.environ if environ is None else environ).get(OPT_OUT) == "retain"


def release_freed(wait_for=None) -> bool:
  """Hands the retained heap's free pages back to the kernel (glibc's `malloc_trim(0)`: every free page, those
  between live blocks too; the heap keeps its address range and faults a page in again when it is reused), after
  `wait_for` (jax values, e.g. the programs whose temporaries should go too) is ready. Returns whether it trimmed:
  without the retained heap (glibc's defaults, an accelerator, the user's own malloc tunables) it does nothing."""
  if not retained():
    return False
  trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
  if trim is None:
    return False
  if wait_for is not None:
    import jax

    jax.block_until_ready(wait_for)
  trim(0)
  return True


BUDGET = "JAXCAP_MEMORY_BUDGET"  # bytes (or e.g. "12GiB") a memory check takes as available; "off": no check
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def parse_bytes(text: str) -> int:
  """'12GiB' / '512MiB' / '1073741824' -> bytes (binary units; '12G' and '12GB' read as GiB)."""
  m = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([kmgt]?)(?:i?b)?\s*", text.lower())
  if m is None:
    raise ValueError(f"{BUDGET}={text!r}: write bytes, e.g. 12GiB, 512MiB or 1073741824 (or 'off')")
  return int(float(m[1]) * _UNITS[m[2]])


def available_memory(environ=None) -> tuple[int, str] | None:
  """(bytes this process may still allocate, where the figure comes from): `JAXCAP_MEMORY_BUDGET` when set, else
  the smaller of /proc/meminfo's MemAvailable and the cgroup's (v2) limit less its usage; None when the budget is
  'off' or nothing can be read (not Linux)."""
  environ = os.environ if environ is None else environ
  if environ.get(BUDGET):
    if environ[BUDGET].strip().lower() == "off":
      return None
    return parse_bytes(environ[BUDGET]), BUDGET
  found = []
  try:
    for line in open("/proc/meminfo"):
      if line.startswith("MemAvailable:"):
        found.append((int(line.split()[1]) * 1024, "MemAvailable in /proc/meminfo"))
  except OSError:
    pass
  try:
    limit = open("/sys/fs/cgroup/memory.max").read().strip()
    if limit != "max":
      used = int(open("/sys/fs/cgroup/memory.current").read())
      found.append((int(limit) - used, "the cgroup's memory.max less memory.current"))
  except (OSError, ValueError):
    pass
  return min(found) if found else None
