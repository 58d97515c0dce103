"""Which of a run's checkpoints can be read, told apart from a config change: a damaged checkpoint (missing or
truncated files, unreadable metadata) is moved aside, never deleted, and the run resumes from the newest intact one.

    problems(step_dir)          # [] or what is wrong, in words, from the files alone (cheap: no array is read)
    fits(step_dir, state)       # whether the saved tree has the keys and shapes of `state` (a failed restore of a
                                # checkpoint that fits is damage; one that does not is a config change)
    set_aside(step_dir, root)   # moves it to <workdir>/checkpoints_damaged/<step>[-n]; returns the new path
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

import jax

DAMAGED_DIR = "checkpoints_damaged"
# Orbax's files of a finished checkpoint (one item "state" of arrays, one "meta" JSON side-car), and what each is.
REQUIRED = {
  "_CHECKPOINT_METADATA": "the checkpoint's own metadata",
  "meta/metadata": "the run position (phase, step, data loader)",
  "state/_METADATA": "the train state's tree metadata",
  "state/manifest.ocdbt": "the train state's array index",
}
JSON_FILES = ("_CHECKPOINT_METADATA", "meta/metadata", "state/_METADATA")


class CheckpointDamagedError(RuntimeError):
  """Checkpoint `step` fits the state this config builds but cannot be read (`why`)."""

  def __init__(self, step: int, directory: Path, why: str):
    self.step, self.directory, self.why = step, Path(directory), why
    super().__init__(f"checkpoint {step} in {Path(directory).parent} cannot be read: {why}")


def problems(step_dir: Path) -> list[str]:
  """What makes a checkpoint directory unreadable, each in words; [] when its files look intact."""
  step_dir = Path(step_dir)
  out = []
  for name, what in REQUIRED.items():
    path = step_dir / name
    if not path.is_file():
      out.append(f"{name} ({what}) is missing")
    elif path.stat().st_size == 0:
      out.append(f"{name} ({what}) is empty")
  if out:
    return out
  parsed = {}
  for name in JSON_FILES:
    try:
      parsed[name] = json.loads((step_dir / name).read_text())
    except (ValueError, UnicodeDecodeError) as e:
      out.append(f"{name} ({REQUIRED[name]}) is not valid JSON ({e})")
  meta = parsed.get("meta/metadata")
  if isinstance(meta, dict) and not {"phase", "step"} <= set(meta):
    out.append(f"meta/metadata ({REQUIRED['meta/metadata']}) has no phase and step")
  elif meta is not None and not isinstance(meta, dict):
    out.append(f"meta/metadata ({REQUIRED['meta/metadata']}) is not a JSON object")
  tree = parsed.get("state/_METADATA")
  if tree is not None and not (isinstance(tree, dict) and isinstance(tree.get("tree_metadata"), dict)):
    out.append("state/_METADATA has no tree_metadata")
  for process in sorted((step_dir / "state").glob("ocdbt.process_*")):
    if not (process / "manifest.ocdbt").is_file():
      out.append(f"state/{process.name}/manifest.ocdbt (that process's array index) is missing")
  return out


def _key(path) -> str:
  """A key path as Orbax's tree metadata writes it: "('params', 'w')"."""
  names = []
  for k in path:
    for attr in ("key", "name", "idx"):
      if hasattr(k, attr):
        names.append(str(getattr(k, attr)))
        break
  return str(tuple(names))


def saved_shapes(step_dir: Path) -> dict[str, tuple[int, ...]]:
  """The saved train state's arrays: Orbax key path -> shape (from state/_METADATA)."""
  tree = json.loads((Path(step_dir) / "state" / "_METADATA").read_text())["tree_metadata"]
  values = {k: v.get("value_metadata", {}) for k, v in tree.items()}
  # None nodes (an absent reference policy, optax's empty states) are recorded too, but hold no array
  return {k: tuple(v.get("write_shape") or ()) for k, v in values.items() if v.get("value_type") != "None"}


def fits(step_dir: Path, state: Any) -> bool:
  """Whether the checkpoint's saved tree has exactly the key paths and shapes of `state` (False also when its
  metadata cannot be read)."""
  try:
    saved = saved_shapes(step_dir)
  except (OSError, ValueError, KeyError, TypeError, AttributeError):
    return False
  want = {_key(p): _saved_shape(x) for p, x in jax.tree_util.tree_flatten_with_path(state)[0]}
  return saved == want


def _saved_shape(x) -> tuple[int, ...]:
  """The shape an array is saved with (a PRNG key as its key data)."""
  if jax.numpy.issubdtype(x.dtype, jax.dtypes.prng_key):
    return tuple(jax.eval_shape(jax.random.key_data, x).shape)
  return tuple(x.shape)


def set_aside(step_dir: Path, workdir: Path) -> Path:
  """Moves a damaged checkpoint directory to <workdir>/checkpoints_damaged/<step> (a -1, -2, ... suffix when that
  exists); nothing is deleted."""
  step_dir = Path(step_dir)
  target_dir = Path(workdir) / DAMAGED_DIR
  target_dir.mkdir(parents=True, exist_ok=True)
  target, n = target_dir / step_dir.name, 0
  while target.exists():
    n += 1
    target = target_dir / f"{step_dir.name}-{n}"
  shutil.move(str(step_dir), str(target))
  return target


def step_dirs(directory: Path) -> list[Path]:
  """The finished-looking checkpoint directories (integer names), newest first."""
  directory = Path(directory)
  if not directory.is_dir():
    return []
  return sorted((p for p in directory.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: -int(p.name))


def read_error(error: BaseException) -> str:
  """A restore's error in one short line (TensorStore appends its whole spec to a read error)."""
  text = str(error).strip().splitlines()[0] if str(error).strip() else ""
  text = text.split(" See full TensorStore details")[0].rstrip(":. ")
  return f"{type(error).__name__}: {text[:300]}" if text else type(error).__name__


# An Orbax restore that fails leaves its other array reads behind: when their event loop has closed they are
# reported as unraisable "RuntimeError: Event loop is closed" tracebacks and "never awaited" warnings, dozens of
# them, that say nothing the restore's own error does not.
_ABANDONED = "_read_array_index_and_device_put"
_quiet = False


def quiet_abandoned_reads() -> None:
  """Silences exactly those reports, for the rest of the process (installed before a checkpoint is restored: only a
  failed restore leaves such reads, and they can report while its error is still being raised)."""
  global _quiet
  if _quiet:
    return
  _quiet = True
  warnings.filterwarnings("ignore", message=f"coroutine '{_ABANDONED}' was never awaited", category=RuntimeWarning)
  previous = sys.unraisablehook

  def hook(report):
    closed = _is_closed_loop((None, report.exc_value))
    if not (closed or _ABANDONED in repr(report.object)):
      previous(report)

  sys.unraisablehook = hook
  logging.getLogger("asyncio").addFilter(lambda record: not _is_closed_loop(record.exc_info))


def _is_closed_loop(exc_info) -> bool:
  error = exc_info[1] if exc_info else None
  return isinstance(error, RuntimeError) and str(error) == "Event loop is closed"
