"""launch/judge_fleet.sh and the trainer agree on the key: the servers start with --api-key from the variable the
trainer reads by default (judge.api_key_env), bind to loopback unless asked, and never start without a key by
accident."""

import os
import subprocess
from pathlib import Path

import pytest

from jaxcap.judges.settings import JudgeConfig

SCRIPT = Path(__file__).resolve().parents[2] / "launch" / "judge_fleet.sh"


def _run(**env):
  full = {k: v for k, v in os.environ.items() if k not in ("JUDGE_API_KEY", "HOST", "PUBLIC_HOST", "API_KEY_ENV")}
  full.update({"GPUS": "0,1", **env})
  return subprocess.run(["bash", str(SCRIPT)], env=full, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_dry_run_serves_loopback_with_the_trainers_key_variable(engine):
  out = _run(DRY_RUN="1", ENGINE=engine, JUDGE_API_KEY="sk-never-printed")
  servers = [line for line in out.stdout.splitlines() if line.startswith("CUDA_VISIBLE_DEVICES=")]
  assert out.returncode == 0 and len(servers) == 2, out.stderr
  assert all("--host 127.0.0.1 " in s and s.rstrip().endswith("--api-key \\$JUDGE_API_KEY") for s in servers)
  assert "sk-never-printed" not in out.stdout + out.stderr
  assert "JUDGE_ENDPOINTS=http://127.0.0.1:8000/v1,http://127.0.0.1:8001/v1" in out.stdout
  assert f"--config.judge.api_key_env={JudgeConfig().api_key_env}" in out.stdout  # the trainer's default


def test_a_missing_key_stops_the_script_before_anything_starts(tmp_path):
  out = _run(LOG_DIR=str(tmp_path / "logs"))
  assert out.returncode == 1 and not (tmp_path / "logs").exists()
  message = out.stderr.strip()
  assert message.startswith("JUDGE_API_KEY is not set") and "--config.judge.api_key_env" in message, message
  fix = message.split("Fix: ", 1)[1]
  assert "export JUDGE_API_KEY=" in fix and "NO_API_KEY=1" in fix and "--config.judge.api_key_env=''" in fix


def test_no_key_and_all_interfaces_only_when_asked():
  out = _run(DRY_RUN="1", NO_API_KEY="1", HOST="0.0.0.0", PUBLIC_HOST="judge0")
  assert out.returncode == 0 and "--api-key" not in out.stdout and "--host 0.0.0.0 " in out.stdout
  assert "--config.judge.api_key_env=''" in out.stdout and "JUDGE_ENDPOINTS=http://judge0:8000/v1" in out.stdout
  assert "warning: serving on 0.0.0.0 without an API key" in out.stderr


@pytest.mark.slow  # the script starts the judge server CLI in a subprocess
def test_servers_started_by_the_script_accept_the_trainers_key(tmp_path, monkeypatch):
  """judge_fleet.sh for real, with a stand-in `vllm` that serves the rule-based judge with the --api-key it is
  given: the script waits for it with the key, and the trainer's preflight passes with the same variable."""
  import signal
  import sys

  from jaxcap.world.dataset import generate_dataset
  from jaxcap.judges.factory import build_judge
  from jaxcap.judges.preflight import JudgePreflightError, preflight_judge
  from judge_servers import free_port

  manifest = generate_dataset(tmp_path / "world", 2, seed=0)
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  fake = bin_dir / "vllm"
  fake.write_text(
    "#!/usr/bin/env bash\n"
    "# vllm serve MODEL --host H --port P --served-model-name N ... --api-key K\n"
    "shift 2; host=; port=; name=; key=\n"
    "while (($#)); do case $1 in --host) host=$2;; --port) port=$2;; --served-model-name) name=$2;;"
    " --api-key) key=$2;; esac; shift; done\n"
    f"FAKE_KEY=$key exec {sys.executable} -m jaxcap.judge serve --rule-based --manifest {manifest} --host $host"
    " --port $port --served-model-name $name --api-key-env FAKE_KEY\n"
  )
  fake.chmod(0o755)
  port = free_port()
  out = _run(
    GPUS="0",
    BASE_PORT=str(port),
    JUDGE_API_KEY="sk-shared",
    LOG_DIR=str(tmp_path / "logs"),
    PATH=f"{bin_dir}:{os.environ['PATH']}",
    PYTHONPATH=str(SCRIPT.parents[1]),
  )
  pids = [int(p) for p in (tmp_path / "logs" / "pids").read_text().split()]
  try:
    assert out.returncode == 0, out.stderr + (tmp_path / "logs" / f"vllm-{port}.log").read_text()
    assert f"JUDGE_ENDPOINTS=http://127.0.0.1:{port}/v1" in out.stdout
    config = JudgeConfig(kind="http", endpoints=f"http://127.0.0.1:{port}/v1")
    for key, ok in (("sk-shared", True), ("sk-other", False)):
      monkeypatch.setenv(config.api_key_env, key)
      judge = build_judge(config)
      try:
        if ok:
          assert preflight_judge(judge, config) is judge
        else:
          with pytest.raises(JudgePreflightError, match=r"refused the API key in \$JUDGE_API_KEY \(HTTP 401\)"):
            preflight_judge(judge, config)
      finally:
        judge.fleet.close()
  finally:
    for pid in pids:
      os.kill(pid, signal.SIGKILL)
