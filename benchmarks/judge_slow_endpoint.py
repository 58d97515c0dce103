"""One judge endpoint that answers --slow-share of requests only after --slow-s (issue 30: 30% after 20 s, at
judge.timeout_s=5): does a step finish near the timeout, with the slow judgments masked and counted?

Serves a chat-completions app on loopback (uvicorn, in a thread), drawing for every request it receives whether it
is slow (seeded), and judges --judgments-per-step multiple-choice judgments per step for --steps steps through
`JudgeFleet` + `HttpJudge`, feeding each step to the failure budget (judge.min_valid_fraction=0.5, patience 3)
as the trainer does. Runs the role as configured (one hedged re-ask after timeout_s / 2) and with hedging off.
Prints per step: wall seconds, judgments valid / failed (by kind) / not sent, requests the server received, the
breaker's state; exits 1 if the budget stopped the run or a step took longer than --slow-s.

    python -m benchmarks.judge_slow_endpoint                  # the issue's numbers: ~1 minute
    python -m benchmarks.judge_slow_endpoint --slow-s 2 --timeout-s 0.5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import socket
import sys
import threading
import time
from pathlib import Path

import numpy as np
import uvicorn
from fastapi import FastAPI, Request

if not __package__:  # run as a file (python benchmarks/judge_slow_endpoint.py): the repository root, for `benchmarks.*`
  sys.path.append(str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import cpu_model
from jaxcap.judges.endpoint import Endpoint
from jaxcap.judges.fleet import JudgeFleet, RoleConfig
from jaxcap.judges.http_judge import HttpJudge
from jaxcap.judges.protocol import MultipleChoiceRequest
from jaxcap.rewards.budget import FailureBudget, JudgeFailureBudgetError


def slow_app(share: float, delay_s: float, seed: int) -> FastAPI:
  app = FastAPI()
  app.state.requests, app.state.slow = 0, 0
  rng = np.random.default_rng(seed)

  @app.post("/v1/chat/completions")
  async def chat(request: Request):
    await request.body()
    app.state.requests += 1
    if rng.random() < share:
      app.state.slow += 1
      await asyncio.sleep(delay_s)
    return {"choices": [{"message": {"role": "assistant", "content": "A"}}]}

  return app


def serve(app: FastAPI):
  sock = socket.socket()
  sock.bind(("127.0.0.1", 0))
  server = uvicorn.Server(uvicorn.Config(app, log_level="error", lifespan="off"))
  thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
  thread.start()
  while not server.started:
    time.sleep(0.01)
  return server, Endpoint(f"http://127.0.0.1:{sock.getsockname()[1]}/v1")


def run(args, hedge_after_s: float | None) -> tuple[list[dict], bool]:
  app = slow_app(args.slow_share, args.slow_s, args.seed)
  server, endpoint = serve(app)
  config = RoleConfig((endpoint,), timeout_s=args.timeout_s, hedge_after_s=hedge_after_s, max_concurrency=16)
  budget, rows, stopped = FailureBudget(0.5, 3), [], False
  with JudgeFleet({"answerer": config}) as fleet:
    judge = HttpJudge(fleet)
    for step in range(1, args.steps + 1):
      requests = [
        MultipleChoiceRequest(f"img{i}", f"step {step} caption {i}", "What colour?", ("red", "blue"))
        for i in range(args.judgments_per_step)
      ]
      before, unsent_before, sent_before = judge.judgment_counts(), judge.unsent_judgments(), app.state.requests
      start = time.perf_counter()
      replies = judge.answer_multiple_choice(requests)
      wall = time.perf_counter() - start
      after, unsent = judge.judgment_counts(), judge.unsent_judgments() - unsent_before
      asked, failed = after[0] - before[0], after[1] - before[1]
      kinds = {k: v - before[2].get(k, 0) for k, v in after[2].items() if v - before[2].get(k, 0)}
      rows.append(
        {
          "step": step,
          "wall_s": round(wall, 2),
          "valid": sum(not r.failed for r in replies),
          "failed_by_kind": kinds,
          "not_sent": unsent,
          "server_requests": app.state.requests - sent_before,
          "breaker": fleet.breaker_states("answerer")[endpoint.url],
        }
      )
      print(json.dumps(rows[-1]), flush=True)
      try:
        budget.observe(step, asked, failed, kinds, judge.last_failure(), unsent=unsent)
      except JudgeFailureBudgetError as e:
        print(f"  stopped: {e}", flush=True)
        stopped = True
        break
  server.should_exit = True
  return rows, stopped


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--slow-share", type=float, default=0.3)
  p.add_argument("--slow-s", type=float, default=20.0)
  p.add_argument("--timeout-s", type=float, default=5.0)
  p.add_argument("--steps", type=int, default=3)
  p.add_argument("--judgments-per-step", type=int, default=16)
  p.add_argument("--seed", type=int, default=0)
  args = p.parse_args(argv)
  print(f"cpu: {cpu_model()}; slow share {args.slow_share}, slow reply {args.slow_s} s, timeout {args.timeout_s} s")
  bad = False
  for name, hedge in (("hedged re-ask after timeout_s / 2 (default)", None), ("no hedge", math.inf)):
    print(f"-- {name}", flush=True)
    rows, stopped = run(args, hedge)
    worst = max(r["wall_s"] for r in rows)
    print(f"  slowest step {worst} s; valid {sum(r['valid'] for r in rows)} of {args.judgments_per_step * len(rows)}")
    bad = bad or stopped or worst >= args.slow_s
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main())
