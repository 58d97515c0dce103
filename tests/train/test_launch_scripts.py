"""The cluster launch scripts parse (bash -n, shellcheck when installed) and, in DRY_RUN mode, print the
commands they claim: the trainer entry point for the TPU pod / SLURM scripts, vLLM / SGLang servers and an
endpoints string for the judge fleet."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "launch"
SCRIPTS = {
  "tpu_pod.sh": "python3 -m jaxcap.launch",
  "slurm_gpu.sbatch": "python -m jaxcap.launch",
  "judge_fleet.sh": "vllm serve",
}


def _dry_run(script, *args, **env):
  full = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
  full.update(DRY_RUN="1", **env)
  out = subprocess.run(
    ["bash", str(LAUNCH / script), *args], env=full, cwd=ROOT, capture_output=True, text=True, timeout=60
  )
  assert out.returncode == 0, out.stderr
  return out.stdout


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_script_parses_and_names_its_entry_point(name):
  path = LAUNCH / name
  subprocess.run(["bash", "-n", str(path)], check=True, timeout=30)
  text = path.read_text()
  assert text.startswith("#!/usr/bin/env bash")
  assert SCRIPTS[name].split()[-1] in text
  assert os.access(path, os.X_OK), f"{name} is not executable"
  if shutil.which("shellcheck"):
    out = subprocess.run(["shellcheck", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout


def test_readme_documents_every_script():
  readme = (LAUNCH / "README.md").read_text()
  for name in SCRIPTS:
    assert f"launch/{name}" in readme


def test_tpu_pod_dry_run_runs_the_trainer_on_every_worker():
  out = _dry_run("tpu_pod.sh", "--config.rl.steps=10", TPU_NAME="pod", ZONE="us-east5-a")
  train = [line for line in out.splitlines() if "jaxcap.launch" in line]
  assert len(train) == 1
  assert "--worker=all" in train[0] and "--config=configs/caprl.py:paper" in train[0]
  assert "JAX_COORDINATOR_ADDRESS=" in train[0] and "--config.rl.steps=10" in train[0]


def test_slurm_dry_run_sets_devices_and_mesh():
  out = _dry_run("slurm_gpu.sbatch", "--config.rl.steps=10", SLURM_GPUS_ON_NODE="4")
  assert "JAX_LOCAL_DEVICE_IDS=0,1,2,3" in out
  cmd = out.strip().splitlines()[-1]
  assert cmd.startswith("srun ") and SCRIPTS["slurm_gpu.sbatch"] in cmd
  assert "--config=configs/caprl.py:paper --config.mesh.shape.fsdp=-1 --config.rl.steps=10" in cmd
  per_gpu = _dry_run("slurm_gpu.sbatch", SLURM_GPUS_ON_NODE="4", SLURM_NTASKS_PER_NODE="4")
  assert "--gpu-bind=none" in per_gpu and "JAX_LOCAL_DEVICE_IDS=auto" in per_gpu


@pytest.mark.parametrize("engine,server", [("vllm", "vllm serve"), ("sglang", "-m sglang.launch_server")])
def test_judge_fleet_dry_run_prints_endpoints(engine, server):
  out = _dry_run("judge_fleet.sh", ENGINE=engine, MODEL="7b", TP="2", GPUS="0,1,2,3", PUBLIC_HOST="judge0")
  servers = [line for line in out.splitlines() if server in line]
  assert len(servers) == 2
  assert servers[0].startswith("CUDA_VISIBLE_DEVICES=0,1 ") and servers[1].startswith("CUDA_VISIBLE_DEVICES=2,3 ")
  assert all("Qwen/Qwen2.5-7B-Instruct" in s for s in servers)
  assert "JUDGE_ENDPOINTS=http://judge0:8000/v1,http://judge0:8001/v1" in out
  assert "--config.judge.endpoints=http://judge0:8000/v1,http://judge0:8001/v1" in out
  assert not (ROOT / "judge-logs").exists(), "a dry run must not create the log directory"
