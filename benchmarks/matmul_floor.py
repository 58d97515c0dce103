"""The matmul floor of a compiled program: every dot read from its HLO and timed alone as its own jitted call, and
the bound that puts on the fraction of the GEMM ceiling the whole program can reach. Used by
`benchmarks.where_time_goes --floor`."""

from __future__ import annotations

import json
import re

import numpy as np

from benchmarks.ceilings import _best_seconds, measure_ceilings, model_gemm_shapes

_DTYPES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16", "f64": "float64"}


def program_dots(hlo: str) -> list[dict]:
  """Every dot of a compiled (loop-free) HLO module: operand dtypes, shapes in memory order (each operand's dims
  permuted major-to-minor by its layout, so a transposed operand is read as it lies), dimension numbers in that
  order, and FLOPs (2 x output elements x contracted size)."""
  shapes = {}
  for m in re.finditer(r"%([\w.\-]+) = (\w+)\[([\d,]*)\]\{([\d,]*)", hlo):
    dims = [int(d) for d in m.group(3).split(",") if d]
    minor_to_major = [int(d) for d in m.group(4).split(",") if d]
    shapes[m.group(1)] = (m.group(2), dims, minor_to_major[::-1] or list(range(len(dims))))
  dots = []
  for m in re.finditer(r"= (\w+)\[([\d,]*)\]\S* dot\(%([\w.\-]+), %([\w.\-]+)\)([^\n]*)", hlo):
    out_dtype, out_dims, lhs, rhs, attrs = m.groups()
    nums = {
      k: [int(d) for d in v.split(",") if d]
      for k, v in re.findall(r"(\w+_(?:batch|contracting)_dims)=\{([\d,]*)\}", attrs)
    }
    operands = []
    for side, name in (("lhs", lhs), ("rhs", rhs)):
      dtype, dims, order = shapes[name]
      where = {logical: i for i, logical in enumerate(order)}
      operands.append(
        dict(
          dtype=_DTYPES[dtype],
          shape=[dims[i] for i in order],
          batch=[where[d] for d in nums.get(f"{side}_batch_dims", [])],
          contracting=[where[d] for d in nums.get(f"{side}_contracting_dims", [])],
        )
      )
    contracted = int(np.prod([shapes[lhs][1][d] for d in nums.get("lhs_contracting_dims", [])]))
    out = int(np.prod([int(d) for d in out_dims.split(",") if d]))
    dots.append(dict(out_dtype=_DTYPES[out_dtype], lhs=operands[0], rhs=operands[1], flops=2.0 * out * contracted))
  return dots


def time_dots_alone(dots: list[dict], budget_s: float = 0.3) -> tuple[float, float]:
  """(seconds, FLOPs) of the program's dots each run alone as its own jitted call (best of several calls, less
  the dispatch time of a call that does nothing): how long the matmuls take with nothing else in the program."""
  import collections

  import jax
  import jax.numpy as jnp

  def key(d):
    return json.dumps([d["out_dtype"], d["lhs"], d["rhs"]], sort_keys=True)

  counts = collections.Counter(key(d) for d in dots)
  rng = np.random.default_rng(0)
  idle = jax.jit(lambda a, b: a.reshape(-1)[0] + b.reshape(-1)[0])
  seconds = 0.0
  for k, n in counts.items():
    out_dtype, lhs, rhs = json.loads(k)
    a, b = (jnp.asarray(rng.standard_normal(o["shape"]), o["dtype"]) for o in (lhs, rhs))
    dims = ((lhs["contracting"], rhs["contracting"]), (lhs["batch"], rhs["batch"]))
    dot = jax.jit(lambda a, b, dims=dims: jax.lax.dot_general(a, b, dims, preferred_element_type=out_dtype))
    alone = _best_seconds(lambda: dot(a, b).block_until_ready(), budget_s)
    overhead = _best_seconds(lambda: idle(a, b).block_until_ready(), budget_s / 3)
    seconds += n * max(alone - overhead, 0.0)
  return seconds, sum(d["flops"] for d in dots)


def print_floor(hlo: str, flops: float, wall_ms: float) -> dict:
  """The matmuls-alone floor of a program and the bound it puts on the program's fraction of the GEMM ceiling."""
  import jaxcap.models as M

  if re.search(r" while\(", hlo):
    raise SystemExit("--floor: the program has a loop (its dots run more than once); use the unrolled layers")
  dots = program_dots(hlo)
  alone_s, dot_flops = time_dots_alone(dots)
  ceiling = measure_ceilings(model_gemm_shapes(M.mid(), 1024), with_torch=False)["xla_gemm_gflops"]
  out = dict(
    dots=len(dots),
    dot_gflop=dot_flops / 1e9,
    dots_alone_ms=alone_s * 1e3,
    dot_gflops_alone=dot_flops / alone_s / 1e9,
    model_gflop=flops / 1e9,
    xla_gemm_ceiling_gflops=ceiling,
    of_ceiling=flops / 1e9 / (wall_ms / 1e3) / ceiling,
    bound_of_ceiling=flops / 1e9 / alone_s / ceiling,
  )
  print(
    f"matmuls alone: {out['dots']} dots, {out['dot_gflop']:.1f} GFLOP, {out['dots_alone_ms']:.0f} ms run one by one "
    f"({out['dot_gflops_alone']:.0f} GFLOP/s; XLA's best GEMM here {ceiling:.0f} GFLOP/s) vs {wall_ms:.0f} ms the "
    f"whole call"
  )
  print(
    f"model FLOPs {out['model_gflop']:.1f} GFLOP per call: the call runs at {100 * out['of_ceiling']:.0f}% of the "
    f"ceiling; with everything but its matmuls free it would run at {100 * out['bound_of_ceiling']:.0f}%"
  )
  return out
