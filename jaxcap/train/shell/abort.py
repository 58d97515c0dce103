"""Clean-up of a run that failed: every wait bounded, nothing raised over the error being handled, so a failed run
exits promptly with its checkpoints complete (or their unfinished temporary directories removed)."""

from __future__ import annotations

import shutil
import sys
import threading
from pathlib import Path

# Bounds on the waits of a run that failed: the checkpoint being written, then each worker pool / client to close.
ABORT_CHECKPOINT_WAIT_S = 300.0
ABORT_CLOSE_WAIT_S = 20.0


def bounded(fn, timeout_s: float, what: str) -> bool:
  """Runs `fn` on a daemon thread for at most `timeout_s`: True if it returned, False (after a one-line warning)
  if it raised or is still running (a daemon thread cannot keep the process alive)."""
  error: list[BaseException] = []

  def target():
    try:
      fn()
    except BaseException as e:  # reported below, never over the error being handled
      error.append(e)

  thread = threading.Thread(target=target, name=f"abort: {what}", daemon=True)
  thread.start()
  thread.join(timeout_s)
  if thread.is_alive():
    print(f"warning: gave up waiting for {what} after {timeout_s:.0f} s", file=sys.stderr, flush=True)
    return False
  if error:
    print(f"warning: {what}: {type(error[0]).__name__}: {error[0]}", file=sys.stderr, flush=True)
    return False
  return True


def remove_partial_checkpoints(directory: Path) -> None:
  """Removes the temporary directories an unfinished Orbax save leaves (`<step>.orbax-checkpoint-tmp*`), so
  the workdir holds only complete checkpoints."""
  for tmp in sorted(directory.glob("*.orbax-checkpoint-tmp*")):
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"removed the unfinished checkpoint {tmp}", file=sys.stderr, flush=True)


def close_judge(judge) -> None:
  """Closes an HTTP judge's fleet (its event loop and client), so no request outlives the run."""
  fleet = getattr(judge, "fleet", None)
  if fleet is not None:
    fleet.close()
