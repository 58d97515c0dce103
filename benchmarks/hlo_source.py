"""HLO source map: each instruction of a compiled HLO module traced back, through the module's stack-frame tables,
to the Python functions that emitted it (innermost first). Used by `benchmarks.where_time_goes`."""

from __future__ import annotations

import re


def _sections(hlo: str) -> dict[str, dict[int, str]]:
  """The FileNames / FunctionNames / FileLocations / StackFrames tables printed at the top of an HLO module."""
  out, cur = {}, None
  for line in hlo.splitlines():
    head = line.strip()
    if head in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
      cur = out.setdefault(head, {})
    elif cur is not None and re.match(r"^\d+ ", line):
      i, rest = line.split(" ", 1)
      cur[int(i)] = rest
    elif line.startswith(("%", "ENTRY", "HloModule")) or line.startswith(" "):
      cur = None
  return out


def source_map(hlo: str) -> dict[str, tuple[str, list[tuple[str, str]], str]]:
  """HLO instruction name -> (op_name metadata, [(file path, function)] innermost first, result shape)."""
  s = _sections(hlo)
  files = {k: v.strip('"') for k, v in s.get("FileNames", {}).items()}
  funcs = {k: v.strip('"') for k, v in s.get("FunctionNames", {}).items()}
  locs = {}
  for k, v in s.get("FileLocations", {}).items():
    d = dict(re.findall(r"(\w+)=(\d+)", v))
    locs[k] = (files.get(int(d["file_name_id"]), "?"), funcs.get(int(d["function_name_id"]), "?"))
  frames = {}
  for k, v in s.get("StackFrames", {}).items():
    d = dict(re.findall(r"(\w+)=(\d+)", v))
    frames[k] = (int(d["file_location_id"]), int(d["parent_frame_id"]))

  def chain(fid, top):
    # the printed parent id is one past the parent's own id; the walk stops at the jitted function itself
    out, seen = [], set()
    while fid in frames and fid not in seen:
      seen.add(fid)
      loc, parent = frames[fid]
      out.append(locs.get(loc, ("?", "?")))
      if out[-1][1] == top:
        break
      fid = parent - 1
    return out

  table = {}
  for line in hlo.splitlines():
    m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = (\S+) .*metadata=\{([^}]*)\}", line)
    if m:
      op = re.search(r'op_name="([^"]*)"', m.group(3))
      sf = re.search(r"stack_frame_id=(\d+)", m.group(3))
      op_name = op.group(1) if op else ""
      top = re.match(r"jit\((\w+)\)", op_name)
      table[m.group(1)] = (op_name, chain(int(sf.group(1)), top and top.group(1)) if sf else [], m.group(2))
  return table
