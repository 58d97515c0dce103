"""benchmarks/ceilings.py: two measurements of the machine's ceilings combine to the best of each rate."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))  # the repository root, for `benchmarks`
from benchmarks import ceilings as C  # noqa: E402


def _run(xla, torch, bw, per_shape):
  rows = [{"shape": [32, 512, n], "xla_gflops": r, "torch_gflops": r + 1} for n, r in per_shape]
  return {"xla_gemm_gflops": xla, "torch_gemm_gflops": torch, "bandwidth_gbs": bw, "gemm_shapes": rows}


def test_best_of_takes_the_higher_rate_of_each_and_keeps_both_runs():
  before = _run(121.0, 150.0, 18.0, [(512, 80.0), (2048, 121.0)])
  after = _run(165.0, 140.0, 15.5, [(512, 90.0), (2048, 165.0)])
  best = C.best_of(before, after)
  assert (best["xla_gemm_gflops"], best["torch_gemm_gflops"], best["bandwidth_gbs"]) == (165.0, 150.0, 18.0)
  assert [r["xla_gflops"] for r in best["gemm_shapes"]] == [90.0, 165.0]
  assert [r["xla_gemm_gflops"] for r in best["measurements"]] == [121.0, 165.0]
  # a third run appends to the record, and the fractions use the best rate
  third = C.best_of(best, _run(100.0, 100.0, 10.0, [(512, 70.0), (2048, 100.0)]))
  assert len(third["measurements"]) == 3 and third["xla_gemm_gflops"] == 165.0
  assert C.fractions(165e9, 2.0, third)["of_xla_gemm"] == 0.5


def test_best_of_without_torch():
  a = {"xla_gemm_gflops": 10.0, "bandwidth_gbs": 1.0, "gemm_shapes": [{"shape": [1, 1, 1], "xla_gflops": 10.0}]}
  b = {"xla_gemm_gflops": 12.0, "bandwidth_gbs": 0.5, "gemm_shapes": [{"shape": [1, 1, 1], "xla_gflops": 12.0}]}
  best = C.best_of(a, b)
  assert "torch_gemm_gflops" not in best and best["xla_gemm_gflops"] == 12.0 and best["bandwidth_gbs"] == 1.0
