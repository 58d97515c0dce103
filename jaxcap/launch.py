"""`python -m jaxcap.launch --config=configs/caprl.py [--config.rl.steps=100 ...]`: train a captioner.

Every config field can be overridden on the command line; the config is validated before any compute.
Multi-host: set --config.distributed.* or run under a cluster that jax.distributed detects (SLURM, TPU pods).
"""

from __future__ import annotations

import os

from absl import app
from absl import logging as absl_logging
from ml_collections import config_flags

from jaxcap.registry import describe
from jaxcap.train.config import REGISTRIES

_CONFIG = config_flags.DEFINE_config_file(
  "config",
  None,
  "Path to a config file, e.g. configs/caprl.py[:paper]; override fields with --config.<field>=<value>. "
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
  where = config.get("compile_cache", "compile_cache")
  if not where:
    return None
  path = os.path.abspath(os.path.join(config.workdir, os.path.expanduser(where)))
  jax.config.update("jax_compilation_cache_dir", path)
  return path


def main(argv):
  del argv
  config = _CONFIG.value
  if config is None:
    raise app.UsageError("--config is required, e.g. --config=configs/caprl.py")
  from jaxcap.train.config import validate

  validate(config)
  absl_logging.set_verbosity(absl_logging.WARNING)  # Orbax and JAX are chatty at INFO
  enable_compilation_cache(config)
  init_distributed(config.distributed)
  from jaxcap.train.loop import Trainer

  summary = Trainer(config).run()
  import json

  keys = [k for k in summary if not k.endswith("_samples")]
  print(json.dumps({k: summary[k] for k in keys}, indent=2))


if __name__ == "__main__":
  app.run(main)
