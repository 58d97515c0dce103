"""A `jax.profiler` trace's op time attributed to model parts: leaf op events swept in time order, each instant
split equally among the ops running then (so overlapping ops are not counted twice), and each op named by
`part_of` from its source frames (`benchmarks.hlo_source`). Used by `benchmarks.where_time_goes`."""

from __future__ import annotations

import collections
import os

_SKIP = ("ThunkExecutor", "SlinkyThreadPool", "ThreadpoolListener", "end: ")


def part_of(op_name: str, frames: list[tuple[str, str]], is_dot: bool) -> str:
  """The model part an op belongs to, from its source frames (innermost first)."""
  fns = [fn for _, fn in frames]
  ctx = {fn.split(".")[0] for fn in fns}
  files = {os.path.basename(f) for f, _ in frames}
  own = next((fn for f, fn in frames if "/jaxcap/" in f), "")  # the innermost jaxcap function
  phase = "backward" if "transpose(" in op_name else "forward"
  if any("optax" in f for f, _ in frames) or "_apply" in ctx:
    return "optimizer: clip + AdamW"
  if "distribution.py" in files:
    return "sampling: filters, draw, log-probs"
  if "Qwen25VL.logits" in fns or "_token_stats" in ctx:
    return f"LM head {'matmul' if is_dot else 'log-softmax'} ({phase})"
  side = "vision" if "VisionTower" in ctx else "decoder"
  if "SwiGLU" in ctx:
    return f"{side} MLP {'matmuls' if is_dot else 'activation silu(gate) * up'} ({phase})"
  if "RMSNorm" in ctx:
    return f"{side} RMSNorm"
  if "VisionAttention" in ctx or "_blocked_attention" in ctx:
    if is_dot and "_blocked_attention" not in ctx:
      return f"vision attention projections ({phase})"
    return f"vision attention core: gather, scores, softmax ({phase})"
  if "Attention" in ctx:
    if is_dot and "Linear" in ctx:
      return f"decoder attention projections ({phase})"
    return f"decoder attention core: rotary, scores, softmax, cache ({phase})"
  if own.startswith(("scan_layers", "stacked", "Qwen25VL.layer_params")):
    return "layer stack: per-layer weight slices, gradient stacking"
  if own.startswith("_accumulate"):
    return "gradient accumulation"
  if side == "vision":
    return "vision other: patch embed, merger, rotary, window order"
  if own.startswith("Qwen25VL.embed"):
    return "embedding + vision placement"
  if own.startswith(("DecoderLayer", "Qwen25VL.decode", "mrope", "completion_positions")):
    return "decoder other: residual adds, masks, rope tables"
  if "generate.py" in files or "sampler.py" in files:
    return "decode loop bookkeeping"
  return "other" + (" (matmul)" if is_dot else "")


# ---------------------------------------------------------------------------------------------- trace -> parts
def attribute(xspace_path: str, table: dict, calls: int) -> tuple[dict[str, float], float, list]:
  """{part: ms per call} from a trace's leaf op events (time split equally among overlapping ops), the
  device-busy ms per call, and [(ms per call, op, part, result shape)] per op, largest first."""
  from jax.profiler import ProfileData

  per_line = collections.defaultdict(list)
  for plane in ProfileData.from_file(xspace_path).planes:
    if plane.name not in ("/host:CPU",) and not plane.name.startswith("/device:"):
      continue
    for line in plane.lines:
      if plane.name == "/host:CPU" and not line.name.startswith("tf_XLA"):
        continue
      for e in line.events:
        if e.duration_ns > 0 and not e.name.startswith(_SKIP):
          per_line[(plane.name, line.name)].append((e.start_ns, e.start_ns + e.duration_ns, e.name))
  leaves = []
  for events in per_line.values():
    events.sort()
    for i, (a, b, name) in enumerate(events):
      if i + 1 < len(events) and events[i + 1][0] < b:
        continue  # it encloses the next event (a loop, a call): count its children instead
      leaves.append((a, b, name))
  edges = sorted([(a, 1, i) for i, (a, _, _) in enumerate(leaves)] + [(b, -1, i) for i, (_, b, _) in enumerate(leaves)])
  share, active, last = collections.Counter(), set(), None
  for t, kind, i in edges:
    if last is not None and active:
      dt = (t - last) / len(active)
      for j in active:
        share[leaves[j][2]] += dt
    last = t
    (active.add if kind == 1 else active.discard)(i)
  parts, ops = collections.Counter(), []
  for name, ns in share.items():
    op_name, frames, shape = table.get(name, ("", [], "?"))
    is_dot = name.startswith(("ynn", "xnn", "dot", "onednn")) or op_name.endswith("dot_general")
    part = part_of(op_name, frames, is_dot)
    parts[part] += ns / 1e6 / calls
    ops.append((ns / 1e6 / calls, name, part, shape))
  return dict(parts), sum(share.values()) / 1e6 / calls, sorted(ops, reverse=True)
