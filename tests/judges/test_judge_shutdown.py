"""A program that fails while judgments are in flight exits promptly with its own error only: the fleet cancels
what is in flight at interpreter exit (so a reward thread blocked on the judge does not hold the exit until the
judge answers) and closes its HTTP client and event loop (no "Event loop is closed" tracebacks)."""

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

HERE = Path(__file__).parent
pytestmark = pytest.mark.slow  # a Python subprocess per case, each waiting on a judge in flight

SCRIPT = textwrap.dedent(
  """
  import sys, time
  sys.path.insert(0, {here!r})
  from judge_servers import serve_in_thread, slow_app
  from jaxcap.judges.fleet import JudgeFleet, RoleConfig
  from jaxcap.judges.http_judge import HttpJudge
  from jaxcap.judges.protocol import CriterionRequest
  from concurrent.futures import ThreadPoolExecutor

  server = serve_in_thread(slow_app(30.0))  # answers after 30 s: every judgment stays in flight
  endpoint = server.__enter__()
  fleet = JudgeFleet({{"judge": RoleConfig((endpoint,), max_concurrency=200, timeout_s=60.0)}})
  judge = HttpJudge(fleet)
  requests = [CriterionRequest("i", "A red circle.", f"criterion {{i}}") for i in range(300)]
  if {mode!r} == "thread":  # the trainer's shape: a reward worker thread (OverlappedReward) blocked on the judge
    future = ThreadPoolExecutor(1).submit(judge.check_criteria, requests)
  else:  # only the fleet's own (daemon) loop thread holds the judgments
    future = fleet.submit("judge", judge.calls("check_criteria", "rubicap_check_criterion", [
      (r, dict(caption=r.caption, criterion=r.criterion), str) for r in requests])[0])
  deadline = time.monotonic() + 20
  while fleet.role_metrics("judge").in_flight < 100 and time.monotonic() < deadline:
    time.sleep(0.05)
  print("in flight:", fleet.role_metrics("judge").in_flight, flush=True)
  raise RuntimeError("bad media in record 17")
  """
)


@pytest.mark.parametrize("mode", ["thread", "daemon"])
def test_error_with_judgments_in_flight_exits_promptly_and_quietly(tmp_path, mode):
  script = tmp_path / "fail.py"
  script.write_text(SCRIPT.format(here=str(HERE), mode=mode))
  start = time.monotonic()
  proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
  elapsed = time.monotonic() - start
  in_flight = int(proc.stdout.split("in flight:")[1].split()[0])
  assert in_flight >= 100, proc.stdout + proc.stderr
  assert proc.returncode == 1
  assert proc.stderr.rstrip().endswith("RuntimeError: bad media in record 17"), proc.stderr[-3000:]
  assert proc.stderr.count("Traceback") == 1, proc.stderr[-3000:]
  for noise in ("Event loop is closed", "Task was destroyed", "Exception ignored", "CancelledError"):
    assert noise not in proc.stderr, proc.stderr[-3000:]
  assert elapsed < 20, f"exit took {elapsed:.1f} s (the slow server answers after 30 s)"
