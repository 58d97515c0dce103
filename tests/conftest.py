import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from processes import FAST_COMPILE_FLAGS  # noqa: E402  (imports no jax)

# Tests run on CPU with 8 virtual devices so that mesh code is exercised, compiling with the tests' fast-compile
# flags (see processes.py); set before jax is imported.
os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count=8 {FAST_COMPILE_FLAGS}")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# A persistent compilation cache per checkout (.pytest_cache is git-ignored, so a fresh clone starts cold), set
# through the environment so the training / CLI subprocesses share it. Every CPU compilation is written, however
# fast or small (jax's defaults skip programs that compiled in under a second). JAX_COMPILATION_CACHE_DIR= (empty)
# or JAX_ENABLE_COMPILATION_CACHE=0 turns it off; delete the directory to start cold (--cache-clear keeps it).
os.environ.setdefault(
  "JAX_COMPILATION_CACHE_DIR",
  os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".pytest_cache", "jax"),
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")

# Longest files first. xdist hands out whole files (--dist loadfile) in collection order; by default it orders
# them by test count, which puts one-test end-to-end files (minutes each) last, where a single worker finishes them
# alone while the other idles. tests/file_durations.json holds each file's measured seconds (refresh it with
# `python -m pytest --record-durations`); files it does not know weigh by their slow marks.
from file_durations import record_durations_option, durations_recorder, longest_files_first  # noqa: E402


def pytest_addoption(parser):
  record_durations_option(parser)


def pytest_configure(config):
  durations_recorder(config)


def pytest_collection_modifyitems(config, items):
  items[:] = longest_files_first(items)
