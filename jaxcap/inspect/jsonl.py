"""JSONL files as the inspector reads them: a run in progress may be writing the last line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator


def json_lines(path: Path) -> Iterator[dict]:
  """The objects of a JSONL file; a line that does not parse (one being written) is skipped, a missing file is
  empty."""
  try:
    text = Path(path).read_text()
  except OSError:
    return
  for line in text.splitlines():
    try:
      row = json.loads(line)
    except json.JSONDecodeError:
      continue
    if isinstance(row, dict):
      yield row
