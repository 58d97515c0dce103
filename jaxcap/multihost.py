"""Host-side coordination of the processes of one run (`jax.distributed`)."""

from __future__ import annotations

from typing import Callable, TypeVar

import jax
import numpy as np

T = TypeVar("T")


def first_process_then_others(fn: Callable[[], T], name: str) -> T:
  """Runs a step that writes shared files on process 0 first; after a barrier named `name` the other processes
  run it too and find the files written (so `fn` must reuse what exists)."""
  if jax.process_count() == 1:
    return fn()
  from jax.experimental import multihost_utils

  out = fn() if jax.process_index() == 0 else None
  multihost_utils.sync_global_devices(name)
  return out if out is not None else fn()


def is_lead_process() -> bool:
  """True on the process that prints and writes run-level files."""
  return jax.process_index() == 0


def allgather_ints(values: np.ndarray) -> list[np.ndarray]:
  """Every process's 1-D int64 `values` (lengths may differ), in process order: two small host all-gathers (the
  lengths, then the padded values). All processes must call it."""
  values = np.asarray(values, np.int64).reshape(-1)
  if jax.process_count() == 1:
    return [values]
  from jax.experimental import multihost_utils

  lengths = np.asarray(multihost_utils.process_allgather(np.asarray([len(values)], np.int64))).reshape(-1)
  padded = np.zeros((int(lengths.max()),), np.int64)
  padded[: len(values)] = values
  everyone = np.asarray(multihost_utils.process_allgather(padded)).reshape(len(lengths), -1)
  return [everyone[p, : int(n)] for p, n in enumerate(lengths)]
