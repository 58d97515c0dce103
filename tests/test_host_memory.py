"""jaxcap.host_memory: when the tunables apply, the re-exec, and that they stop XLA:CPU's per-call page faults."""

import os
import subprocess
import sys
import textwrap

import pytest

from jaxcap import host_memory

glibc_only = pytest.mark.skipif(
  not sys.platform.startswith("linux") or host_memory.platform.libc_ver()[0] != "glibc", reason="glibc tunables"
)


@glibc_only
def test_tunables_apply_on_cpu_only_once_and_keep_the_users():
  env = host_memory.retained_env({"JAX_PLATFORMS": "cpu", "PATH": "/bin"})
  assert env["GLIBC_TUNABLES"] == host_memory.TUNABLES and env["PATH"] == "/bin"
  assert host_memory.retained_env(env) is None  # the re-executed process does not loop
  assert host_memory.retained_env({"JAX_PLATFORMS": "tpu"}) is None
  assert host_memory.retained_env({"JAX_PLATFORMS": "cuda,cpu"}) is None
  assert host_memory.retained_env({"JAX_PLATFORMS": "cpu", host_memory.OPT_OUT: "system"}) is None
  # the user's own malloc tunables win; other tunables are kept beside ours
  assert host_memory.retained_env({"JAX_PLATFORMS": "cpu", "GLIBC_TUNABLES": "glibc.malloc.arena_max=4"}) is None
  env = host_memory.retained_env({"JAX_PLATFORMS": "cpu", "GLIBC_TUNABLES": "glibc.cpu.x86_shstk=off"})
  assert env["GLIBC_TUNABLES"] == "glibc.cpu.x86_shstk=off:" + host_memory.TUNABLES


_PROBE = textwrap.dedent(
  """
  import os, resource, sys
  from jaxcap.host_memory import retain_on_cpu
  print("start", os.environ.get("GLIBC_TUNABLES", "-"), flush=True)
  retain_on_cpu()
  import jax, jax.numpy as jnp
  # a program whose temporary buffer (the 4500 x 4500 outer product a matmul reads, 81 MB: above glibc's largest
  # mmap threshold, 32 MiB, so by default it is mapped and unmapped per call) XLA:CPU allocates and
  # frees on every call
  f = jax.jit(lambda x: jnp.outer(jnp.sin(x), jnp.cos(x)) @ x)
  x = jnp.linspace(0.0, 1.0, 4500)
  # warm-up: with asynchronous dispatch a few calls' buffers are live at once, so the heap grows for a while before
  # every request finds a freed buffer (measured: no new faults after <= 20 calls)
  for _ in range(25):
    f(x).block_until_ready()
  before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  for _ in range(10):
    f(x).block_until_ready()
  print("faults", (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) // 10, flush=True)
  """
)


def _probe(**env):
  base = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", host_memory.OPT_OUT)}
  out = subprocess.run(
    [sys.executable, "-c", _PROBE],
    env={**base, "JAX_PLATFORMS": "cpu", **env},
    capture_output=True,
    text=True,
    timeout=300,
    check=True,
  ).stdout.split("\n")
  starts = [line for line in out if line.startswith("start")]
  faults = int(next(line for line in out if line.startswith("faults")).split()[1])
  return starts, faults


@pytest.mark.slow
@glibc_only
def test_reexec_keeps_freed_buffers_and_stops_the_page_faults():
  kept_starts, kept = _probe()
  default_starts, default = _probe(JAXCAP_HOST_MALLOC="system")
  # re-executed once: the second start already has the tunables; opted out: one start
  assert kept_starts == ["start -", f"start {host_memory.TUNABLES}"]
  assert default_starts == ["start -"]
  # 4500 x 4500 f32 (81 MB) faulted back in every call by default (~20k pages), reused with the tunables
  assert default > 10_000
  assert kept < default / 5


_HOLE = textwrap.dedent(
  """
  import numpy as np
  from jaxcap.host_memory import release_freed

  def anon():
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("RssAnon"))

  block = np.ones(200 * 2**20, np.uint8)  # 200 MiB: on the retained heap, a block of the heap itself
  pin = np.ones(2**20, np.uint8)  # a live block after it: freeing `block` leaves a hole, not a free top to trim
  before = anon()
  del block
  freed = anon()
  trimmed = release_freed()
  print(before >> 20, freed >> 20, anon() >> 20, trimmed, pin.size)
  """
)


@glibc_only
def test_release_freed_hands_back_a_hole_between_live_blocks():
  """A freed block between live ones stays resident on the retained heap (what stacked the RL update's buffers on
  the rollouts'); `release_freed` gives its pages back, and does nothing with glibc's defaults."""

  def probe(**env):
    base = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", host_memory.OPT_OUT)}
    out = subprocess.run(
      [sys.executable, "-c", _HOLE], env={**base, **env}, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    before, freed, after, trimmed, _ = out.stdout.split()
    return int(before), int(freed), int(after), trimmed == "True"

  before, freed, after, trimmed = probe(GLIBC_TUNABLES=host_memory.TUNABLES, JAXCAP_HOST_MALLOC="retain")
  assert trimmed and freed > before - 50 and after < before - 150  # kept when freed, handed back when released
  before, freed, after, trimmed = probe(JAXCAP_HOST_MALLOC="system")
  assert not trimmed and freed < before - 150  # glibc's defaults: mapped on its own, unmapped on free
