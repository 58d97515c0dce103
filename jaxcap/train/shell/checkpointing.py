"""Run checkpoints with Orbax: the train state plus a JSON side-car (phase, data iterator position, history).

Saves are asynchronous where Orbax can make them so; `wait()` blocks until the last one is on disk.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp


class RunCheckpointer:
  """Keeps the latest `max_to_keep` checkpoints of a run under `directory` (one folder per global step)."""

  def __init__(self, directory: str | Path, max_to_keep: int = 2):
    self.manager = ocp.CheckpointManager(
      Path(directory).absolute(),
      item_names=("state", "meta"),
      options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True),
    )

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state: Any, meta: dict) -> None:
    self.manager.save(
      step, args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=True
    )

  def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict]:
    """The state at `step`, placed with the shardings of `abstract_state` (a pytree of arrays or
    ShapeDtypeStructs with shardings), and its meta dict."""
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), abstract_state)
    out = self.manager.restore(
      step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore())
    )
    return out["state"], out["meta"]

  def meta(self, step: int) -> dict:
    """Only the JSON side-car of a checkpoint (cheap: no arrays are read)."""
    return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.close()
