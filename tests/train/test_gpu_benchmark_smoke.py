"""benchmarks/gpu.py does not rot: its --smoke mode (tiny shapes) runs on CPU and reports both figures."""

import json
import sys
import time

import pytest

from processes import ROOT, load_module, run_command

SCRIPT = ROOT / "benchmarks" / "gpu.py"


def _module():
  return load_module(SCRIPT, "gpu_benchmark")


def test_peak_table():
  peak = _module().peak_tflops
  assert peak("NVIDIA H100 80GB HBM3") == 989 and peak("NVIDIA H200") == 989
  assert peak("NVIDIA A100-SXM4-80GB") == 312
  assert peak("TPU v5 lite") == 197 and peak("TPU v5p") == 459 and peak("TPU v5") == 459
  assert peak("TPU v4") == 275 and peak("cpu") is None


@pytest.mark.slow
def test_smoke_runs_on_cpu(tmp_path):
  out = tmp_path / "gpu.json"
  t0 = time.perf_counter()
  proc = run_command(
    [sys.executable, str(SCRIPT), "--smoke", "--peak_tflops", "1", "--out", str(out)], timeout=170, check=False
  )
  elapsed = time.perf_counter() - t0
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
  summary = json.loads(out.read_text())
  assert summary["model"] == "tiny" and summary["params"]["total"] > 0
  roll = summary["rollout"]
  assert roll["generated_tokens"] == roll["sequences"] * roll["new_tokens"] and roll["tokens_per_s"] > 0
  upd = summary["update"]
  assert upd["tokens_per_step"] == upd["prompts"] * upd["group"] * (upd["prompt_tokens"] + upd["completion_tokens"])
  assert upd["model_tflop_per_step"] > 0 and upd["model_tflop_split"]["vision"] > 0
  assert 0 < upd["mfu"] < 1 and upd["peak_tflops"] == 1.0
  print(f"gpu.py --smoke: {elapsed:.1f} s")
