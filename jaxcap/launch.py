"""`python -m jaxcap.launch --config=configs/caprl.py [--config.rl.steps=100 ...]`: train a captioner.

Every config field can be overridden on the command line; the config is validated before any compute, and an
unknown field is named with the closest existing ones.
Multi-host: set --config.distributed.* or run under a cluster that jax.distributed detects (SLURM, TPU pods).

A workdir holds one run: its resolved config is saved as <workdir>/config.json at the first start, and a rerun
resumes from the latest checkpoint. A rerun whose config alters the run (model, data, reward, optimiser, batch
shapes, seed, number of processes, ...) is refused with the list of changes unless --config.resume_changes=allow;
more steps, evaluation / checkpoint cadence and judge endpoints may change freely (jaxcap/train/shell/resume.py).
The workdir is locked (<workdir>/jaxcap.lock) while a trainer runs in it.

On an error the checkpoint being written is completed (or removed), the error is printed as one line with its
traceback in <workdir>/error.log, and the process exits with status 1 (2 for an invalid config, 130 on Ctrl-C, 143
on SIGTERM); a config error exits 2 whichever layer finds it (a flag value of the wrong type, a config file that does
not load, validate(), a config that leaves nothing to do).
"""

from __future__ import annotations

import difflib
import os
import re
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from absl import app
from absl import logging as absl_logging
from ml_collections import config_flags

from jaxcap.config import cli as config_cli
from jaxcap.registry import describe
from jaxcap.config_files import REGISTRIES

_CONFIG = config_flags.DEFINE_config_file(
  "config",
  None,
  "Path to a config file, e.g. configs/caprl.py[:paper], or a preset's name from any directory (caprl, "
  "rubicap, balcaprl, caprl_video, sft); override fields with --config.<field>=<value>. "
  "Fields that choose by name, and the registered names:\n" + describe(REGISTRIES),
  lock_config=True,
)


def init_distributed(d) -> None:
  """jax.distributed from explicit flags, or auto-detected from the cluster environment (SLURM, TPU, ...)."""
  import jax

  if d.coordinator_address:
    jax.distributed.initialize(d.coordinator_address, num_processes=d.num_processes, process_id=d.process_id)
  elif (
    any(
      k in os.environ
      for k in ("SLURM_JOB_ID", "TPU_WORKER_HOSTNAMES", "MEGASCALE_COORDINATOR_ADDRESS", "JAX_COORDINATOR_ADDRESS")
    )
    and int(os.environ.get("SLURM_NTASKS", "2")) > 1
  ):
    jax.distributed.initialize()


def enable_compilation_cache(config) -> str | None:
  """A persistent XLA compilation cache, so that a restarted run (and the next run in the same workdir) loads its
  programs instead of compiling them: `compile_cache` in the config, relative to the workdir (default
  <workdir>/compile_cache), an absolute path, or "" to turn it off. JAX_COMPILATION_CACHE_DIR in the environment
  (as the tests set it) takes precedence. Returns the directory in use, or None."""
  import jax

  if "JAX_COMPILATION_CACHE_DIR" in os.environ:
    return os.environ["JAX_COMPILATION_CACHE_DIR"] or None
  where = config.compile_cache
  if not where:
    return None
  path = os.path.abspath(os.path.join(config.workdir, os.path.expanduser(where)))
  jax.config.update("jax_compilation_cache_dir", path)
  return path


# After an error, the most the process may take to exit (non-daemon threads of libraries still winding down).
EXIT_GRACE_S = 30.0


class Terminated(BaseException):
  """SIGTERM (e.g. a cluster preempting the job), raised in the main thread so the run aborts cleanly."""


def config_keys(tree, prefix: str = "") -> list[str]:
  """Every field path of a config (inner nodes and leaves), e.g. 'rl', 'rl.optim', 'rl.optim.lr'."""
  out = []
  for k, v in tree.items():
    out.append(prefix + k)
    if hasattr(v, "items") and v:
      out += config_keys(v, prefix + k + ".")
  return out


def closest_keys(key: str, keys: list[str], n: int = 4) -> list[str]:
  """Existing keys a mistyped `key` most likely meant: the same last name (those under the same top-level block
  first), then the most similar spellings."""
  last, top = key.split(".")[-1], key.split(".")[0]
  same_name = [k for k in keys if k.split(".")[-1] == last]
  same_name.sort(key=lambda k: (k.split(".")[0] != top, len(k)))
  similar = difflib.get_close_matches(key, keys, n=n, cutoff=0.6)
  return list(dict.fromkeys(same_name + similar))[:n]


def unknown_override_error(argv: list[str]) -> str | None:
  """'--config.rl.lr: no such config field ...' for the first override naming a field the config file lacks, or
  None (all exist, or the config file itself does not load)."""
  path = None
  for i, arg in enumerate(argv):
    if arg.startswith(("--config=", "-config=")):
      path = arg.split("=", 1)[1]
    elif arg in ("--config", "-config") and i + 1 < len(argv):
      path = argv[i + 1]
  if not path:
    return None
  try:
    from ml_collections.config_flags.config_flags import ConfigFileFlagParser

    config = ConfigFileFlagParser("config").parse(path)
  except Exception:  # the flag parser reports a config file that does not load
    return None
  keys = config_keys(config)
  leaves = [k for k in keys if not any(other.startswith(k + ".") for other in keys)]
  for arg in argv:
    m = re.match(r"^-{1,2}(?:no)?config\.([^=]+)", arg)
    if m and m.group(1) not in keys:
      key = m.group(1)
      near = closest_keys(key, leaves, n=3)
      hint = f". Closest existing fields: {', '.join(near)}" if near else ""
      return f"--config.{key}: {path.split(':')[0]} has no field {key!r}{hint}"
  return None


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with a named error (and the closest existing keys) for an override of a missing field,
  where ml_collections raises AttributeError."""
  try:
    return config_cli.parse_flags(argv)  # a value of the wrong type, a missing config file: exit 2 naming it
  except (AttributeError, KeyError):
    message = unknown_override_error(config_cli.resolve_config_args(argv))
    if message is None:
      raise
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def _on_sigterm(signum, frame):
  raise Terminated()


def fail(error: BaseException, workdir: str | None) -> None:
  """Prints `error` as one readable line (its traceback goes to <workdir>/error.log) and exits non-zero, within
  EXIT_GRACE_S even if library threads are still winding down."""
  from jaxcap.locking import LockHeldError

  where = None
  # every failed start leaves its error in the workdir, except where the workdir is another live run's
  if workdir and not isinstance(error, LockHeldError):
    try:
      import jax

      index = jax.process_index()
      where = Path(workdir) / ("error.log" if index == 0 else f"error-{index}.log")
      where.write_text("".join(traceback.format_exception(error)))
    except Exception:  # no backend or no disk: the message below still says what failed
      where = None
  if isinstance(error, KeyboardInterrupt):
    message, status = "interrupted; the last complete checkpoint is kept", 130
  elif isinstance(error, Terminated):
    message, status = "terminated by SIGTERM; the last complete checkpoint is kept", 143
  else:
    message = f"{type(error).__name__}: {error}"
    status = config_cli.CONFIG_ERROR_STATUS if isinstance(error, config_cli.ConfigError) else 1
  print(f"error: {message}" + (f"\n(traceback: {where})" if where else ""), file=sys.stderr, flush=True)
  sys.stdout.flush()
  # a daemon thread keeps running while the interpreter waits for non-daemon ones at exit: it bounds that wait
  threading.Thread(target=lambda: (time.sleep(EXIT_GRACE_S), os._exit(status)), daemon=True).start()
  sys.exit(status)


def main(argv):
  del argv
  config = _CONFIG.value
  if config is None:
    config_cli.fail("--config is required, e.g. --config=configs/caprl.py (or --config=caprl from any directory)")
  from jaxcap.config_files import validate

  try:
    config = validate(config_cli.loaded(config))  # the typed, frozen run config from here on
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(config_cli.CONFIG_ERROR_STATUS)
  absl_logging.set_verbosity(absl_logging.WARNING)  # Orbax and JAX are chatty at INFO
  signal.signal(signal.SIGTERM, _on_sigterm)
  try:
    enable_compilation_cache(config)
    init_distributed(config.distributed)
    from jaxcap.train.shell.trainer import Trainer

    summary = Trainer(config).run()
  except (Exception, KeyboardInterrupt, Terminated) as e:
    fail(e, config.workdir)
  import json

  keys = [k for k in summary if not k.endswith("_samples")]
  print(json.dumps({k: summary[k] for k in keys}, indent=2))
  from jaxcap.multihost import is_lead_process
  from jaxcap.train.shell.run_end import end_of_run

  if is_lead_process():  # where the outputs are and what reads them next
    print("\n".join(end_of_run(config)), flush=True)


def run() -> None:
  """The command line entry point (`python -m jaxcap.launch`)."""
  app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
  from jaxcap.host_memory import retain_on_cpu

  retain_on_cpu()
  run()
