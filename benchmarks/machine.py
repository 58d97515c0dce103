"""The machine a benchmark runs on and the load on it: CPU model, core counts (affinity, cgroup quota), thread
settings and library versions, the 1-minute load average when the script started, and the machine-wide and own
CPU time (from /proc/stat and getrusage) from which `harness.Section` tells how busy other processes kept the cores.

Imports nothing of benchmarks/.
"""

from __future__ import annotations

import os
import platform
import resource
import sys

# Taken when the benchmark script starts (it imports this module before any heavy work), so it shows the load
# other processes put on the machine, before this process adds its own.
LOAD_AT_START = os.getloadavg()[0]


def usable_cores() -> int:
  """Cores this process may run on (its CPU affinity), which can be fewer than `os.cpu_count()`."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not Linux
    return os.cpu_count() or 1


def cpu_model() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine() or "unknown"


def _cpu_quota() -> str | None:
  """The cgroup v2 CPU limit ("quota period" in microseconds), if one is set."""
  try:
    with open("/sys/fs/cgroup/cpu.max") as f:
      quota = f.read().strip()
  except OSError:
    return None
  return None if quota.startswith("max") else quota


def machine_info() -> dict:
  """CPU model, core counts, thread settings and library versions (of those already imported)."""
  info = dict(
    cpu_model=cpu_model(),
    cpu_count=os.cpu_count(),
    usable_cores=usable_cores(),
    cgroup_cpu_max=_cpu_quota(),
    python=platform.python_version(),
    omp_wait_policy=os.environ.get("OMP_WAIT_POLICY"),
    omp_num_threads=os.environ.get("OMP_NUM_THREADS"),
    xla_flags=os.environ.get("XLA_FLAGS"),
    glibc_tunables=os.environ.get("GLIBC_TUNABLES"),  # jaxcap.host_memory: freed XLA buffers kept or unmapped
  )
  torch = sys.modules.get("torch")
  if torch is not None:
    info["torch"] = torch.__version__
    info["torch_threads"] = torch.get_num_threads()
  for name in ("transformers", "jax"):
    mod = sys.modules.get(name)
    if mod is not None:
      info[name] = mod.__version__
  if "jax" in sys.modules:
    info["jax_platform"] = sys.modules["jax"].devices()[0].platform
  return info


def machine_lines(info: dict) -> list[str]:
  env = ", ".join(f"{k}={info[k.lower()]}" for k in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS") if info[k.lower()])
  return [
    f"machine: {info['cpu_model']}; os.cpu_count()={info['cpu_count']}, usable cores (affinity)="
    f"{info['usable_cores']}" + (f", cgroup cpu.max={info['cgroup_cpu_max']}" if info["cgroup_cpu_max"] else ""),
    f"software: torch {info.get('torch', '-')} ({info.get('torch_threads', '-')} threads), transformers "
    f"{info.get('transformers', '-')}, jax {info.get('jax', '-')} on {info.get('jax_platform', '-')}, python "
    f"{info['python']}" + (f"; {env}" if env else ""),
    "host malloc: "
    + (
      "freed buffers kept (jaxcap.host_memory)" if info.get("glibc_tunables") else "glibc defaults (unmapped on free)"
    ),
  ]


def busy_seconds() -> float | None:
  """CPU seconds the whole machine has spent busy (all cores, all processes, incl. steal) since boot."""
  try:
    with open("/proc/stat") as f:
      fields = [int(x) for x in f.readline().split()[1:]]
  except (OSError, ValueError):
    return None
  # user nice system idle iowait irq softirq steal (guest time is already inside user)
  busy = sum(fields[:3]) + sum(fields[5:8])
  return busy / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
  r = resource.getrusage(resource.RUSAGE_SELF)  # all threads of this process
  return r.ru_utime + r.ru_stime
