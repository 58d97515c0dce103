"""One slow or briefly failing endpoint costs its own judgments, not the step (issue 30, case 4): a slow reply is
hedged once and then masked and counted, the breaker opens only when the endpoint answers nothing, requests
behind an open breaker wait for its probe instead of failing unsent, and the failure budget counts the
judgments that were tried, with steps numbered as metrics.jsonl numbers them.

The issue's numbers (20 s replies at timeout_s=5) run in `python -m benchmarks.judge_slow_endpoint`; here they
are scaled down: 2 s replies at timeout_s=0.5."""

import asyncio
import time

import numpy as np
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from judge_servers import serve_in_thread

from jaxcap.judges.settings import JudgeConfig
from jaxcap.judges.fleet import JudgeFleet, RoleConfig
from jaxcap.judges.http_judge import HttpJudge
from jaxcap.judges.protocol import MultipleChoiceRequest
from jaxcap.rewards.budget import judged_reward
from jaxcap.rewards.mix import build_reward
from jaxcap.world.dataset import generate_dataset, judge_for_manifest

SLOW_S, TIMEOUT_S = 2.0, 0.5
SLOW = "(slow)"  # captions holding this get their reply after SLOW_S, both copies


def slow_for_some_app(delay_s: float = SLOW_S) -> FastAPI:
  """Answers "A" at once, or after `delay_s` when the prompt holds SLOW; counts the requests it got."""
  app = FastAPI()
  app.state.requests = 0

  @app.post("/v1/chat/completions")
  async def chat(request: Request):
    app.state.requests += 1
    body = await request.json()
    if SLOW in str(body["messages"]):
      await asyncio.sleep(delay_s)
    return {"choices": [{"message": {"role": "assistant", "content": "A"}}]}

  return app


def failing_at_first_app(seconds: float) -> FastAPI:
  """503 for every request in its first `seconds`, then "A"."""
  app = FastAPI()
  app.state.started, app.state.refused, app.state.requests = None, 0, 0

  @app.post("/v1/chat/completions")
  async def chat(request: Request):
    await request.body()
    app.state.requests += 1
    app.state.started = app.state.started or time.monotonic()
    if time.monotonic() - app.state.started < seconds:
      app.state.refused += 1
      return JSONResponse({"error": {"message": "warming up"}}, status_code=503)
    return {"choices": [{"message": {"role": "assistant", "content": "A"}}]}

  return app


def _requests(n: int, slow: set[int]) -> list[MultipleChoiceRequest]:
  return [
    MultipleChoiceRequest("img", f"caption {i}{' ' + SLOW if i in slow else ''}", "What colour?", ("red", "blue"))
    for i in range(n)
  ]


@pytest.mark.parametrize(
  "slow_s, timeout_s", [(SLOW_S, TIMEOUT_S), pytest.param(20.0, 5.0, marks=pytest.mark.slow, id="issue-numbers")]
)
def test_a_slow_reply_costs_its_own_judgment_not_the_batch(slow_s, timeout_s):
  slow = {0, 3, 6, 9, 12, 15}  # 30% of 20
  app = slow_for_some_app(slow_s)
  with (
    serve_in_thread(app) as endpoint,
    JudgeFleet({"answerer": RoleConfig((endpoint,), timeout_s=timeout_s, max_concurrency=16)}) as fleet,
  ):
    start = time.perf_counter()
    replies = HttpJudge(fleet).answer_multiple_choice(_requests(20, slow))
    elapsed = time.perf_counter() - start
    m, states = fleet.role_metrics("answerer"), fleet.breaker_states("answerer")
  assert [i for i, r in enumerate(replies) if r.failed] == sorted(slow)  # exactly the slow ones, masked
  assert all(r.reply == "A" for i, r in enumerate(replies) if i not in slow)
  assert all(
    r.error.startswith(f"timeout: {endpoint.url}: no reply within {timeout_s:g} s") for r in replies if r.failed
  )
  assert m.failed_judgments == 6 and m.failed_by_kind == {"timeout": 6} and m.unsent_judgments == 0  # counted
  # one re-ask for each slow request, nothing retried beyond it; on a loaded machine a fast reply can also pass the
  # hedge delay (timeout / 2) and be re-asked once (9 hedges seen in a full run on 2 cores): at most one re-ask each
  # (a re-ask whose original answered first may be cancelled before the server counts it)
  assert 6 <= m.hedges <= 20 and m.requests == 20 + m.hedges and 26 <= app.state.requests <= m.requests
  assert list(states.values()) == ["closed"]  # the endpoint kept answering: its breaker never opened
  assert elapsed < slow_s  # hedge (timeout / 2) + timeout, not the slow reply


def test_requests_behind_an_open_breaker_wait_for_its_probe_instead_of_failing_unsent():
  app = failing_at_first_app(0.2)
  config = dict(max_attempts=1, max_concurrency=3, breaker_failures=3, breaker_cooldown_s=0.3)
  with serve_in_thread(app) as endpoint:
    with JudgeFleet({"answerer": RoleConfig((endpoint,), **config)}) as fleet:
      replies = HttpJudge(fleet).answer_multiple_choice(_requests(12, set()))
      m = fleet.role_metrics("answerer")
      breaker = fleet._pools["answerer"].endpoints[0].breaker
  failed = [r for r in replies if r.failed]
  assert len(failed) == app.state.refused >= 3  # the requests the server refused, each its own judgment ...
  assert all(r.error.startswith(f"http_status: {endpoint.url}: HTTP 503") for r in failed)
  assert [r.reply for r in replies if not r.failed] == ["A"] * (12 - len(failed))  # ... the rest answered
  assert m.unsent_judgments == 0 and app.state.requests == 12  # every judgment was sent once
  assert breaker.times_opened == 1 and breaker.state == "closed"  # opened, probed, closed


def test_breaker_counts_failures_only_while_the_endpoint_answers_nothing():
  from jaxcap.judges.breaker import CircuitBreaker

  now = [0.0]
  breaker = CircuitBreaker(failure_threshold=2, cooldown_s=10, clock=lambda: now[0])
  early = [breaker.on_send() for _ in range(3)]  # sent at t=0
  now[0] = 1.0
  breaker.on_success(breaker.on_send())  # answered at t=1
  for send in early:  # time out at t=5: slow requests of a live endpoint
    now[0] = 5.0
    breaker.on_failure(send)
  assert breaker.state == "closed" and breaker.consecutive_failures == 0
  late = [breaker.on_send() for _ in range(2)]  # sent at t=5, nothing answered since
  now[0] = 6.0
  for send in late:
    breaker.on_failure(send)
  assert breaker.state == "open" and breaker.times_opened == 1 and breaker.seconds_to_half_open() == 10.0
  now[0] = 16.0
  probe = breaker.on_send()
  assert probe.probe and not breaker.allows()
  breaker.on_cancel(probe)  # a cancelled probe frees the half-open slot
  assert breaker.allows()
  breaker.on_failure(breaker.on_send())
  assert breaker.state == "open" and breaker.probe_failures == 1 and breaker.times_opened == 1


@pytest.fixture(scope="module")
def world(tmp_path_factory):
  records, _ = judge_for_manifest(str(generate_dataset(tmp_path_factory.mktemp("slow_world"), 10, seed=5)))
  return records


def test_the_budget_counts_slow_judgments_masked_and_numbers_steps_from_one(world):
  records = world
  slow = {1, 4, 7}
  captions = [r.reference_caption + (f" {SLOW}" if i in slow else "") for i, r in enumerate(records)]
  with (
    serve_in_thread(slow_for_some_app()) as endpoint,
    JudgeFleet({"answerer": RoleConfig((endpoint,), timeout_s=TIMEOUT_S)}) as fleet,
  ):
    judge = HttpJudge(fleet)
    reward = judged_reward(build_reward({"caprl": {"questions_per_caption": 1}}, judge), judge, JudgeConfig())
    batches = [reward(captions, records, step=step) for step in range(3)]
    reward.budget.min_valid_fraction = 0.9  # now 70% valid is too few: the budget stops at the third step
    with pytest.raises(Exception) as stopped:
      for step in range(3, 6):
        reward(captions, records, step=step)
  for batch in batches:
    assert np.flatnonzero(~batch.valid[:, 0]).tolist() == sorted(slow)  # masked, never scored 0 as valid
    assert batch.extras["judge/valid_fraction"] == pytest.approx(0.7)
    assert batch.extras["judge/failed/timeout"] == 3.0 and batch.extras["judge/unsent"] == 0.0
  assert type(stopped.value).__name__ == "JudgeFailureBudgetError"
  assert "for 3 consecutive RL steps (steps 4-6: 21 of 30 judgments valid)" in str(stopped.value)
