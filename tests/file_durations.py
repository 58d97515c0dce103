"""Per-file test durations for scheduling: `longest_files_first` orders the collected tests so that xdist's
file-at-a-time hand-out (--dist loadfile --no-loadscope-reorder) starts the longest files first (longest processing
time first: the run ends within one file's time of the ideal), and `--record-durations` writes each file's
measured seconds (setup + call + teardown of its tests) to tests/file_durations.json."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("file_durations.json")
UNKNOWN_SLOW_S = 60.0  # a file not in the table yet: a guess from its marks
UNKNOWN_QUICK_S = 2.0


def record_durations_option(parser) -> None:
  parser.addoption(
    "--record-durations",
    action="store_true",
    help=f"write each test file's measured seconds to {DURATIONS.name} (merged: files not run keep their figure)",
  )


def _file(nodeid: str) -> str:
  return nodeid.split("::", 1)[0]


def longest_files_first(items: list) -> list:
  """`items` grouped by file, the files by descending recorded seconds (stable: ties keep collection order)."""
  known = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
  slow = collections.defaultdict(bool)
  for item in items:
    slow[_file(item.nodeid)] |= item.get_closest_marker("slow") is not None

  def seconds(file: str) -> float:
    return known.get(file, UNKNOWN_SLOW_S if slow[file] else UNKNOWN_QUICK_S)

  order = {f: i for i, f in enumerate(dict.fromkeys(_file(i.nodeid) for i in items))}
  return sorted(items, key=lambda item: (-seconds(_file(item.nodeid)), order[_file(item.nodeid)]))


class _Recorder:
  def __init__(self):
    self.seconds = collections.defaultdict(float)

  @pytest.hookimpl
  def pytest_runtest_logreport(self, report):
    self.seconds[_file(report.nodeid)] += report.duration

  @pytest.hookimpl
  def pytest_sessionfinish(self, session):
    if not self.seconds or hasattr(session.config, "workerinput"):  # the xdist controller writes, not its workers
      return
    table = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    table.update({f: round(s, 1) for f, s in self.seconds.items()})
    DURATIONS.write_text(json.dumps(dict(sorted(table.items(), key=lambda kv: -kv[1])), indent=0) + "\n")


def durations_recorder(config) -> None:
  if config.getoption("record_durations"):
    config.pluginmanager.register(_Recorder(), "file_durations_recorder")
