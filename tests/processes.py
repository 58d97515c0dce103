"""Running tests' subprocesses: CPU environments with N virtual devices, the trainer and the other CLIs
(`launch`, `cli`), groups of jax.distributed processes on one machine (gloo collectives), and the config files
(`load_config`). A helper module, not a test file: every test that starts `python -m jaxcap.*` goes through it."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"


# XLA:CPU compile options for the tests, whose tiny programs spend seconds compiling and milliseconds running:
# LLVM at -O0 and XLA's older loop emitters instead of the fusion emitters compile the tiny model's SFT step ~5x
# faster (8.8 s -> 1.7 s here; docs/benchmarks-history.md, "test compile flags") and run it in about as long.
# Tests only: a user's run keeps XLA's defaults. Both sides of every in-test comparison compile with the same flags.
def fast_compile_flags(jaxlib_version: str | None = None) -> str:
  """The flags for `jaxlib_version` (default: the installed one, read without importing jax): jaxlib 0.11 removed
  the loop emitters' switch and rejects `--xla_cpu_use_fusion_emitters` (the suite aborted at its first compile)."""
  if jaxlib_version is None:
    from importlib.metadata import PackageNotFoundError, version

    try:
      jaxlib_version = version("jaxlib")
    except PackageNotFoundError:
      jaxlib_version = "0"
  major_minor = tuple(int(p) for p in (jaxlib_version.split(".") + ["0", "0"])[:2] if p.isdigit())
  flags = ["--xla_backend_optimization_level=0", "--xla_cpu_parallel_codegen_split_count=1"]
  if major_minor < (0, 11):
    flags.insert(1, "--xla_cpu_use_fusion_emitters=false")
  return " ".join(flags)


FAST_COMPILE_FLAGS = fast_compile_flags()


def cpu_env(devices: int = 1, **changes: str | None) -> dict[str, str]:
  """The environment of a CPU-only jax process with `devices` virtual devices; jaxcap and tests/ importable.
  `changes` set variables (None: removes one, e.g. JUDGE_API_KEY=None)."""
  env = {
    **os.environ,
    "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices} {FAST_COMPILE_FLAGS}",
    "JAX_PLATFORMS": "cpu",
    "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo",
    "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]),
  }
  for key, value in changes.items():
    if value is None:
      env.pop(key, None)
    else:
      env[key] = value
  return env


# -- config files --------------------------------------------------------------------------------------------


def config_file(spec: str | os.PathLike) -> Path:
  """configs/<name>.py from 'caprl', 'caprl.py', 'configs/caprl.py' or a path (a ':variant' suffix dropped)."""
  path = Path(_split_variant(spec)[0])
  if path.suffix != ".py":
    return CONFIGS / f"{path.name}.py"
  if path.is_absolute():
    return path
  return ROOT / path if (ROOT / path).exists() else CONFIGS / path.name


def _split_variant(spec: str | os.PathLike) -> tuple[str, str | None]:
  name, _, variant = str(spec).partition(":")
  return name, variant or None


def load_module(path: str | os.PathLike, name: str | None = None):
  """Executes a Python file (a config, a benchmark script) as a module of its own and returns it."""
  path = Path(path)
  spec = importlib.util.spec_from_file_location(name or path.stem, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def load_config(spec: str | os.PathLike, variant: str | None = None, **overrides):
  """`get_config()` of a config file (see `config_file`; 'caprl:paper' or `variant` picks a variant), with dotted
  `overrides` applied: load_config("caprl", **{"rl.optim.lr": 1e-3})."""
  variant = variant or _split_variant(spec)[1]
  module = load_module(config_file(spec), f"config_{config_file(spec).stem}")
  c = module.get_config() if variant is None else module.get_config(variant)
  for key, value in overrides.items():
    *path, leaf = key.split(".")
    node = c
    for k in path:
      node = node[k]
    node[leaf] = value
  return c


# -- the trainer and the other CLIs --------------------------------------------------------------------------

# The smallest run of the main job that goes through every phase (vision warm-up, SFT, RL, held-out evaluation):
# a one-layer student on a world of 8 scenes. Tests add the settings their case needs: tiny_run({"rl.steps": 0}).
TINY = {
  "sft.steps": 2,
  "sft.batch_size": 4,
  "sft.max_target_tokens": 16,
  "rl.steps": 2,
  "rl.batch_size": 2,
  "rl.num_samples": 2,
  "sampling.max_new_tokens": 8,
  "world.train_scenes": 8,
  "world.eval_scenes": 4,
  "eval.num_images": 4,
  "model.student.text_layers": 1,
  "model.student.vision_depth": 1,
  "vision_warmup.steps": 2,
  "vision_warmup.batch_size": 4,
  "export.hf": False,
  "logging.curves": False,  # matplotlib's import and a figure: ~1.6 s a run (tests/train/test_train_resume.py draws)
}
# A longer one: checkpoints and evaluations between steps, RL batches of 4 prompts x 4 samples, 32 scenes.
SMALL = {
  **TINY,
  "sft.steps": 4,
  "sft.batch_size": 8,
  "sft.max_target_tokens": 32,
  "rl.steps": 6,
  "rl.batch_size": 4,
  "rl.num_samples": 4,
  "sampling.max_new_tokens": 16,
  "world.train_scenes": 32,
  "world.eval_scenes": 8,
  "eval.num_images": 8,
  "eval.every": 2,
  "checkpoint.every": 2,
}


def flags(settings: Mapping[str, object]) -> list[str]:
  """--config.<key>=<value> for each setting (None: leaves it out)."""
  return [f"--config.{k}={v}" for k, v in settings.items() if v is not None]


# SFT only, a checkpoint every step, no RL / eval / warm-up: the shortest run that writes checkpoints to resume from
SFT_CHECKPOINTS = {
  "sft.steps": 3,
  "rl.steps": 0,
  "rl.batch_size": None,
  "rl.num_samples": None,
  "sampling.max_new_tokens": None,
  "eval.num_images": 0,
  "checkpoint.every": 1,
  "vision_warmup.steps": 0,
  "vision_warmup.batch_size": None,
}


def tiny_run(changes: Mapping[str, object] = (), base: Mapping[str, object] = TINY) -> list[str]:
  """The flags of `base` (TINY or SMALL) with `changes` (None: drops a setting, leaving the config's value)."""
  return flags({**base, **dict(changes)})


# jaxcap's commands run as in a user's install, without torch (tests/as_installed.py): `[*AS_INSTALLED, "-m",
# "jaxcap.caption", ...]` or `[*AS_INSTALLED, script, ...]`.
AS_INSTALLED = (sys.executable, str(ROOT / "tests" / "as_installed.py"))


def launch_command(config: str = "caprl", *args: str, workdir=None, script: str | None = None) -> list[str]:
  """`python -m jaxcap.launch --config=configs/<config>.py [--config.workdir=...] args` (`script`: a file run in
  its place with the same flags, e.g. tests/train/fault_launch.py), as installed (`AS_INSTALLED`)."""
  head = [*AS_INSTALLED, str(script)] if script else [*AS_INSTALLED, "-m", "jaxcap.launch"]
  variant = _split_variant(config)[1]
  variant = f":{variant}" if variant else ""
  path = config_file(config)
  arg = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
  workdir = [f"--config.workdir={workdir}"] if workdir is not None else []
  return [*head, f"--config={arg}{variant}", *workdir, *args]


def run_command(
  cmd: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 600, check: bool = True
) -> subprocess.CompletedProcess:
  """Runs `cmd` in the repository root (default environment: cpu_env(1)) capturing its text output; `check`:
  asserts it exited 0, showing the tail of its stderr."""
  out = subprocess.run(
    list(cmd), env=cpu_env(1) if env is None else dict(env), cwd=ROOT, capture_output=True, text=True, timeout=timeout
  )
  if check:
    assert out.returncode == 0, f"{' '.join(cmd[:4])} ... exited {out.returncode}:\n{out.stderr[-3000:]}"
  return out


def launch(
  config: str = "caprl",
  *args: str,
  workdir=None,
  env: Mapping[str, str] | None = None,
  timeout: float = 600,
  check: bool = True,
  script: str | None = None,
) -> subprocess.CompletedProcess:
  """Runs the trainer (`launch_command`) to its end; see `run_command`."""
  return run_command(
    launch_command(config, *args, workdir=workdir, script=script), env=env, timeout=timeout, check=check
  )


def start(cmd: Sequence[str], env: Mapping[str, str] | None = None, **kw) -> subprocess.Popen:
  """Starts `cmd` in the repository root without waiting (default environment: cpu_env(1); stdout and stderr
  together in .stdout, as text, unless `kw` says otherwise): for a test that kills it or serves from it."""
  kw = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True, **kw}
  return subprocess.Popen(list(cmd), env=cpu_env(1) if env is None else dict(env), cwd=ROOT, **kw)


def kill_after_checkpoint(
  cmd: Sequence[str], workdir, log, min_step: int, timeout: float = 600, env: Mapping[str, str] | None = None
) -> None:
  """Starts the trainer `cmd` (writing to `workdir`, its output to the file `log`; environment `env` as `start`'s),
  SIGKILLs it as soon as a checkpoint of global step >= `min_step` is on disk (so mid-run, after that checkpoint)
  and waits for it; fails, showing the log's tail, if the run ended before it could be killed."""
  with open(log, "w") as out:  # a file, not a pipe nobody reads while it runs
    proc = start(cmd, env=env, stdout=out)
  ckpts = Path(workdir) / "checkpoints"
  deadline = time.time() + timeout
  while time.time() < deadline:
    steps = [int(p.name) for p in ckpts.glob("[0-9]*") if p.name.isdigit()] if ckpts.exists() else []
    if any(s >= min_step for s in steps) or proc.poll() is not None:
      break
    time.sleep(0.2)
  assert proc.poll() is None, f"the run ended before it could be killed:\n{Path(log).read_text()[-3000:]}"
  proc.send_signal(signal.SIGKILL)
  proc.wait()


def cli(module: str, *args: str, **kw) -> subprocess.CompletedProcess:
  """`python -m jaxcap.<module> args` (plan, eval, caption, experiments, judge, ...) as installed; see `run_command`."""
  return run_command([*AS_INSTALLED, "-m", f"jaxcap.{module}", *args], **kw)


# `JAX_LOG_COMPILES=1` lines: (program name, its argument shapes); logged at lowering, so also on a cache hit.
COMPILING = re.compile(r"Compiling jit\((\w+)\) with global shapes and types (.*)\. Argument mapping")


def compiles(stderr: str) -> list[tuple[str, str]]:
  """The programs a JAX_LOG_COMPILES=1 process compiled, in order, with their argument shapes."""
  return COMPILING.findall(stderr)


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
  procs = [start(command(i, port), env=cpu_env(devices)) for i in range(count)]
  outs = [p.communicate(timeout=timeout)[0] for p in procs]
  assert all(p.returncode == 0 for p in procs), "\n".join(o[-2000:] for o in outs)
  return outs


def launch_processes(config: str, *args: str, workdir, count: int = 2, script: str | None = None) -> list[str]:
  """The trainer (`launch_command`) as `count` jax.distributed processes of one CPU device each, sharing
  `workdir`, on a free coordinator port; see `run_processes`."""
  return run_processes(
    lambda i, port: launch_command(
      config,
      *args,
      f"--config.distributed.coordinator_address=127.0.0.1:{port}",
      f"--config.distributed.num_processes={count}",
      f"--config.distributed.process_id={i}",
      workdir=workdir,
      script=script,
    ),
    count=count,
    devices=1,
  )
