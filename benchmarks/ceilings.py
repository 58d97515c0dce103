"""The machine's own limits, measured in the benchmark's process: the best f32 GEMM rate of XLA and of torch at the
model's matmul shapes, and the memory bandwidth of a large copy. Benchmarks report each path as a fraction of
them (model FLOPs/s over the GEMM ceiling, MFU-style) beside the ratio against transformers.

    python -m benchmarks.ceilings [--model mid] [--tokens 1024] [--json ceilings.json]

Built on `benchmarks.machine` (machine info); `fractions` and `print_ceilings` read a ceilings record for
`benchmarks.report`, which prints them beside a benchmark's figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

if not __package__:  # run as a file (python benchmarks/ceilings.py): the repository root, for `benchmarks.*`
  sys.path.append(str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import machine_info  # noqa: E402

__all__ = ["best_of", "fractions", "measure_ceilings", "measured_ceilings", "model_gemm_shapes", "print_ceilings"]


def fractions(model_flops_per_call: float, seconds: float, ceilings: dict) -> dict:
  """Model GFLOP/s of a call and its fraction of each GEMM ceiling (a `measure_ceilings` record)."""
  rate = model_flops_per_call / seconds / 1e9
  out = {"model_gflops": rate, "of_xla_gemm": rate / ceilings["xla_gemm_gflops"]}
  if "torch_gemm_gflops" in ceilings:
    out["of_torch_gemm"] = rate / ceilings["torch_gemm_gflops"]
  return out


def print_ceilings(c: dict) -> None:
  line = f"ceilings: XLA f32 GEMM {c['xla_gemm_gflops']:.0f} GFLOP/s"
  if "torch_gemm_gflops" in c:
    line += f", torch f32 GEMM {c['torch_gemm_gflops']:.0f} GFLOP/s"
  line += f", copy bandwidth {c['bandwidth_gbs']:.1f} GB/s (best over the model's matmul shapes"
  runs = c.get("measurements", [])
  if len(runs) > 1:  # before and after the timed section
    line += "; best of runs at " + " / ".join(f"{r['xla_gemm_gflops']:.0f}" for r in runs) + " GFLOP/s"
  print(line + ")")


def _best_seconds(fn, budget_s: float = 1.0, min_calls: int = 3) -> float:
  """Min wall time of `fn()` over at least `min_calls` calls or `budget_s` seconds, after one warm-up call."""
  fn()
  best, start, calls = float("inf"), time.perf_counter(), 0
  while calls < min_calls or time.perf_counter() - start < budget_s:
    t0 = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - t0)
    calls += 1
  return best


def model_gemm_shapes(cfg, tokens: int) -> list[tuple[int, int, int]]:
  """(M, K, N) of the model's big matmuls at `tokens` rows: attention projections, MLP, LM head chunk, ViT MLP."""
  t, v = cfg.text, cfg.vision
  return [
    (tokens, t.hidden_size, t.intermediate_size),
    (tokens, t.intermediate_size, t.hidden_size),
    (tokens, t.hidden_size, t.num_attention_heads * t.head_dim),
    (tokens, t.hidden_size, min(t.vocab_size, 8192)),
    (4 * tokens, v.hidden_size, v.intermediate_size),
    (2048, 2048, 2048),
  ]


def measure_ceilings(shapes, budget_s: float = 1.0, bandwidth_mib: int = 256, with_torch: bool = True) -> dict:
  """Best f32 GEMM GFLOP/s of XLA (and torch) over `shapes`, and copy bandwidth in GB/s (bytes read + written)."""
  import jax
  import jax.numpy as jnp

  rng = np.random.default_rng(0)
  rows = []
  for m, k, n in shapes:
    a = rng.standard_normal((m, k), np.float32)
    b = rng.standard_normal((k, n), np.float32)
    flops = 2.0 * m * k * n
    xa, xb = jnp.asarray(a), jnp.asarray(b)
    mm = jax.jit(jnp.matmul)
    row = {
      "shape": [m, k, n],
      "xla_gflops": flops / _best_seconds(lambda: mm(xa, xb).block_until_ready(), budget_s) / 1e9,
    }
    if with_torch:
      import torch

      ta, tb = torch.from_numpy(a), torch.from_numpy(b)
      with torch.inference_mode():
        row["torch_gflops"] = flops / _best_seconds(lambda: torch.matmul(ta, tb), budget_s) / 1e9
    rows.append(row)
  n = bandwidth_mib * 2**20 // 4
  x = jnp.asarray(rng.standard_normal(n, np.float32))
  copy = jax.jit(lambda x: x * 1.0001)  # one read + one write of every element
  bandwidth = 2 * 4 * n / _best_seconds(lambda: copy(x).block_until_ready(), budget_s) / 1e9
  out = {
    "xla_gemm_gflops": max(r["xla_gflops"] for r in rows),
    "bandwidth_gbs": bandwidth,
    "gemm_shapes": rows,
  }
  if with_torch:
    out["torch_gemm_gflops"] = max(r["torch_gflops"] for r in rows)
  return out


def best_of(a: dict, b: dict) -> dict:
  """Two measurements of the same ceilings -> the higher of each rate (per shape too); `measurements` lists each
  one's headline rates."""
  keys = [k for k in ("xla_gemm_gflops", "torch_gemm_gflops", "bandwidth_gbs") if k in a and k in b]
  rows = [
    {"shape": ra["shape"], **{k: max(ra[k], rb[k]) for k in ra if k != "shape" and k in rb}}
    for ra, rb in zip(a["gemm_shapes"], b["gemm_shapes"])
  ]
  runs = a.get("measurements", [{k: a[k] for k in keys}]) + b.get("measurements", [{k: b[k] for k in keys}])
  return {**{k: max(a[k], b[k]) for k in keys}, "gemm_shapes": rows, "measurements": runs}


def measured_ceilings(args, cfg, tokens: int, with_torch: bool = True, previous: dict | None = None) -> dict | None:
  """The machine's GEMM and bandwidth ceilings at `cfg`'s matmul shapes, unless --no_ceilings (`harness.add_arguments`).
  With `previous` (the same measured before the timed section), the best of both: a shared host's rates drift by
  tens of percent over minutes, and a ceiling caught in a slow minute would flatter every fraction."""
  if getattr(args, "no_ceilings", False):
    return None
  now = measure_ceilings(model_gemm_shapes(cfg, tokens), with_torch=with_torch)
  return now if previous is None else best_of(previous, now)


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--model", default="mid", help="jaxcap.models preset whose matmul shapes are measured")
  ap.add_argument("--tokens", type=int, default=1024, help="rows of the measured matmuls")
  ap.add_argument("--json", default=None)
  args = ap.parse_args()
  import jaxcap.models as M

  c = measure_ceilings(model_gemm_shapes(M.PRESETS[args.model](), args.tokens))
  print(f"machine: {machine_info().get('cpu_model', '?')}")
  for r in c["gemm_shapes"]:
    torch_rate = f"  torch {r['torch_gflops']:7.1f}" if "torch_gflops" in r else ""
    print(f"  {str(tuple(r['shape'])):24s} XLA {r['xla_gflops']:7.1f}{torch_rate} GFLOP/s")
  print_ceilings(c)
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"machine": machine_info(), **c}, f, indent=2)


if __name__ == "__main__":
  from jaxcap.host_memory import retain_on_cpu

  retain_on_cpu()  # as the launcher does (JAXCAP_HOST_MALLOC=system: glibc defaults)
  main()
