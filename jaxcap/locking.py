"""Exclusive locks that name their holder: one trainer per workdir, one `jaxcap.caption` per output file.

A lock is a kernel `flock` on a small file that also records who holds it (host, pid, start time, command).
The kernel drops the lock when its process dies, however it dies, so a lock left by a killed run is never
stale: the next run takes it and says whose it was. A second process gets `LockHeldError` naming the holder.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import shlex
import socket
import sys
from pathlib import Path


class LockHeldError(RuntimeError):
  """Another process holds the lock; the message names it and the ways out."""


def _holder() -> dict:
  argv = getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv]
  return {
    "host": socket.gethostname(),
    "pid": os.getpid(),
    "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    "command": shlex.join(argv),
  }


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # exists, owned by someone else
    return True
  return True


def describe_holder(info: dict) -> str:
  """'pid 123 on host h, started <time>, command: <cmd>' (the command cut to 300 characters)."""
  if not info:
    return "a process that has not written its name yet"
  cmd = str(info.get("command", "?"))
  cmd = cmd if len(cmd) <= 300 else cmd[:297] + "..."
  return (
    f"pid {info.get('pid', '?')} on host {info.get('host', '?')}, started {info.get('started', '?')}, command: {cmd}"
  )


class ExclusiveLock:
  """`ExclusiveLock(path, what=..., fix=...).acquire()` holds `path` until `release()` (or process exit).

  `what` names the locked thing in messages ("workdir runs/x"), `fix` says what to do instead ("use another
  --config.workdir"). Not re-entrant: a second acquire of the same file, even in this process, fails."""

  def __init__(self, path: str | os.PathLike, *, what: str, fix: str):
    self.path, self.what, self.fix = Path(path), what, fix
    self._fd: int | None = None
    self.recovered: dict | None = None  # holder info left by a run that died holding the lock

  def acquire(self) -> "ExclusiveLock":
    self.path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)  # not O_TRUNC: the holder's name is in the file
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      info = _read(fd)
      os.close(fd)
      if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
        raise LockHeldError(self._held_message(info)) from None
      # a filesystem without locks (some network / FUSE mounts): run unlocked rather than not at all
      print(f"warning: cannot lock {self.what} ({self.path}: {e}); running without a lock", file=sys.stderr)
      return self
    previous = _read(fd)
    if previous:  # a clean release empties the file, so this holder died holding the lock
      self.recovered = previous
      state = (
        "no longer running"
        if previous.get("host") == socket.gethostname() and not _alive(int(previous.get("pid", 0) or 0))
        else "it no longer holds the lock"
      )
      print(
        f"note: took over the lock of {self.what} left by {describe_holder(previous)} ({state}; its lock file "
        f"{self.path} was stale)",
        file=sys.stderr,
      )
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(_holder()) + "\n").encode(), 0)
    os.fsync(fd)
    self._fd = fd
    return self

  def _held_message(self, info: dict) -> str:
    msg = f"{self.what} is in use by another process: {describe_holder(info)} (lock file {self.path})."
    if info.get("host") == socket.gethostname() and info.get("pid") and not _alive(int(info["pid"])):
      # flock is shared with children that inherited the descriptor: the named process is gone, a child is not
      msg += (
        f" That process is no longer running, but a process it started still holds the lock; find it with "
        f"`fuser {self.path}` and stop it."
      )
    return f"{msg} Wait for it to finish or stop it, or {self.fix}."

  def release(self) -> None:
    """Empties the lock file (so the next holder knows the release was clean) and unlocks it."""
    fd, self._fd = self._fd, None
    if fd is None:
      return
    try:
      os.ftruncate(fd, 0)
    finally:
      os.close(fd)  # closing the last descriptor drops the flock

  @property
  def held(self) -> bool:
    return self._fd is not None

  def __enter__(self) -> "ExclusiveLock":
    return self.acquire() if not self.held else self

  def __exit__(self, *exc) -> None:
    self.release()

  def __del__(self):
    try:
      self.release()
    except Exception:  # interpreter shutdown; the kernel drops the lock anyway
      pass


def _read(fd: int) -> dict:
  try:
    data = os.pread(fd, 4096, 0).decode(errors="replace").strip()
    return json.loads(data) if data else {}
  except (OSError, ValueError):
    return {"command": "(unreadable lock file)"}


def lock_workdir(workdir: str | os.PathLike, process_index: int = 0) -> ExclusiveLock:
  """Holds `workdir` for this trainer process: `jaxcap.lock` for process 0, `jaxcap-<i>.lock` for process i (the
  processes of one multi-host run share a workdir; two runs do not)."""
  name = "jaxcap.lock" if process_index == 0 else f"jaxcap-{process_index}.lock"
  return ExclusiveLock(
    Path(workdir) / name, what=f"workdir {workdir}", fix="use another --config.workdir for a separate run"
  ).acquire()


def lock_output(out: str | os.PathLike) -> ExclusiveLock:
  """Holds an annotator output file (`jaxcap.caption --out`) through `<out>.lock`."""
  out = Path(out)
  return ExclusiveLock(
    out.with_name(out.name + ".lock"), what=f"output {out}", fix="pass another --out for a separate run"
  ).acquire()
