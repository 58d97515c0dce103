"""Faults: a killed endpoint, an endpoint slower than the timeout, malformed JSON, unparseable replies.
Every run finishes in bounded time; affected judgments are masked and counted, never scored 0."""

import threading
import time

import numpy as np
import pytest
from judge_servers import fixed_reply_app, kill, malformed_json_app, rule_server_process, serve_in_thread, slow_app

from jaxcap.world.dataset import generate_dataset, judge_for_manifest
from jaxcap.judges.fleet import JudgeFleet, RoleConfig
from jaxcap.judges.http_judge import HttpJudge
from jaxcap.rewards.overlap import OverlappedReward
from jaxcap.judges.protocol import CriterionRequest, MultipleChoiceRequest
from jaxcap.world.judge_server import rule_based_app_for_manifest
from jaxcap.rewards.mix import build_reward

FAST = dict(backoff_s=0.01, max_backoff_s=0.05, breaker_cooldown_s=60.0)
QUICK_PROBE = {**FAST, "breaker_cooldown_s": 0.2}  # one endpoint: requests behind its open breaker wait for a probe


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
  return str(generate_dataset(tmp_path_factory.mktemp("fault_world"), 4, seed=5))


@pytest.fixture(scope="module")
def world(manifest):
  records, judge = judge_for_manifest(manifest)
  captions = [c for r in records for c in r.teacher_captions.values()]  # 5 per image, image-major
  return records, captions, judge


def _kill_after_requests(fleet, role, proc, count):
  """Kills `proc` once the fleet has sent `count` requests (so the kill lands mid-run)."""

  def watch():
    deadline = time.monotonic() + 30
    while fleet.role_metrics(role).requests < count and time.monotonic() < deadline:
      time.sleep(0.005)
    kill(proc)

  thread = threading.Thread(target=watch, daemon=True)
  thread.start()
  return thread


@pytest.mark.slow  # the judge server CLI in a subprocess
@pytest.mark.parametrize("max_attempts", [3, 1])
def test_one_of_two_endpoints_killed_mid_run(manifest, world, max_attempts):
  records, captions, direct = world
  records = [r for r in records for _ in range(5)] * 2  # one record per caption
  captions = captions * 2
  config = {"caprl": {"questions_per_caption": 1}}  # one judgment per caption: failed <=> masked
  # the killed server's requests fail at once (connection reset / refused); the timeout only has to spare the
  # survivor, which answers from a thread of this process and can take seconds when the machine is loaded
  with (
    rule_server_process(manifest, latency_s=0.05) as (doomed, proc),
    serve_in_thread(rule_based_app_for_manifest(manifest, added_latency_s=0.05)) as survivor,
    JudgeFleet(
      {"answerer": RoleConfig((doomed, survivor), max_concurrency=8, timeout_s=10.0, max_attempts=max_attempts, **FAST)}
    ) as fleet,
  ):
    watcher = _kill_after_requests(fleet, "answerer", proc, 12)
    start = time.perf_counter()
    with OverlappedReward(build_reward(config, HttpJudge(fleet))) as overlapped:
      batch = overlapped.submit(captions, records, step=0).result(timeout=60)
    elapsed = time.perf_counter() - start
    watcher.join()
    m = fleet.role_metrics("answerer")
    states = fleet.breaker_states("answerer")
  assert proc.returncode is not None and elapsed < 30
  assert m.endpoint_failures[doomed.url] > 0 and m.endpoint_failures[survivor.url] == 0
  assert m.endpoint_requests[survivor.url] > m.endpoint_requests[doomed.url]
  assert states[doomed.url] == "open" and states[survivor.url] == "closed"
  failed = batch.failed_judgments.get("answer_multiple_choice", 0)
  assert failed == m.failed_judgments  # every lost judgment is counted, once
  expected = build_reward(config, direct)(captions, records, step=0)
  ok = batch.valid[:, 0]
  np.testing.assert_allclose(batch.values[ok], expected.values[ok])  # surviving judgments are right
  if max_attempts == 3:
    assert failed == 0 and ok.all()  # retries moved the dead endpoint's work to the survivor
  else:
    assert failed > 0  # no retries: in-flight judgments on the killed server are lost ...
    assert int((~ok).sum()) == failed  # ... and each one masks exactly its caption
    assert (batch.values[~ok] == 0).all()


def test_endpoint_slower_than_timeout(world):
  records, captions, _ = world
  requests = [MultipleChoiceRequest(records[0].id, c, "What colour?", ("red", "blue")) for c in captions[:6]]
  with serve_in_thread(slow_app(3.0)) as slow, serve_in_thread(fixed_reply_app("B")) as fast:
    with JudgeFleet({"answerer": RoleConfig((slow, fast), timeout_s=0.3, max_concurrency=4, **FAST)}) as fleet:
      start = time.perf_counter()
      replies = HttpJudge(fleet).answer_multiple_choice(requests)
      mixed_elapsed = time.perf_counter() - start
      m = fleet.role_metrics("answerer")
      assert [r.reply for r in replies] == ["B"] * 6 and m.hedges > 0 and m.failures["cancelled"] > 0
      assert m.failed_judgments == 0 and mixed_elapsed < 3.0  # the hedge on the fast one won; slow copies dropped
    with JudgeFleet({"answerer": RoleConfig((slow,), timeout_s=0.3, max_attempts=2, **QUICK_PROBE)}) as fleet:
      start = time.perf_counter()
      replies = HttpJudge(fleet).answer_multiple_choice(requests)
      alone_elapsed = time.perf_counter() - start
      m = fleet.role_metrics("answerer")
  assert len(replies) == 6 and all(
    r.failed and ("timeout" in r.error or "all_endpoints_open" in r.error) for r in replies
  )
  assert m.failed_judgments == 6 and alone_elapsed < 2.5  # bounded: timeouts, then the breaker fails fast


def test_malformed_json_endpoint(manifest, world):
  records, captions, direct = world
  config = {"rubicap": {}}
  with serve_in_thread(malformed_json_app()) as broken, serve_in_thread(rule_based_app_for_manifest(manifest)) as good:
    with JudgeFleet({"judge": RoleConfig((broken, good), **FAST)}) as fleet:
      batch = build_reward(config, HttpJudge(fleet))(captions, records)
      m = fleet.role_metrics("judge")
    assert batch.valid.all() and m.failures["malformed_response"] > 0 and m.failed_judgments == 0
    np.testing.assert_allclose(batch.values, build_reward(config, direct)(captions, records).values)
    with JudgeFleet({"judge": RoleConfig((broken,), max_attempts=2, **QUICK_PROBE)}) as fleet:
      batch = build_reward(config, HttpJudge(fleet))(captions, records)
      m = fleet.role_metrics("judge")
  assert not batch.valid.any()  # every caption masked ...
  assert batch.failed_judgments["check_criteria"] == m.failed_judgments == m.judgments > 0  # ... and counted
  assert m.failures["malformed_response"] > 0


def test_unparseable_reply_is_reasked_then_a_failed_judgment_not_a_zero():
  requests = [CriterionRequest("img", "A red circle.", f"criterion {i}") for i in range(3)]
  app = fixed_reply_app("I am not sure, it depends.")
  with (
    serve_in_thread(app) as endpoint,
    JudgeFleet({"judge": RoleConfig((endpoint,), parse_attempts=2, **QUICK_PROBE)}) as fleet,
  ):
    verdicts = HttpJudge(fleet).check_criteria(requests)
    again = HttpJudge(fleet).check_criteria(requests)  # failures are not cached
    m = fleet.role_metrics("judge")
  assert all(v.failed and "unparseable_reply" in v.error for v in verdicts + again)
  assert app.state.requests == 12 and m.failures["unparseable_reply"] == 12 and m.cache_hits == 0
