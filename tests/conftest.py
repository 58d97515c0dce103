import os
import sys

# Tests run on CPU with 8 virtual devices so that mesh code is exercised; set before jax is imported.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
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
sys.path.insert(0, os.path.dirname(__file__))
