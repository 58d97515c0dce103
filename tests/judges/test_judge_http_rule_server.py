"""HttpJudge over the rule-based OpenAI-compatible server: the HTTP path is lossless, cached, concurrent,
and masks failures exactly as the in-process judge does."""

import json
import time

import httpx
import numpy as np
import pytest
from judge_servers import fixed_reply_app, serve_in_thread

from jaxcap.curate_qa import main as curate_main
from jaxcap.world.dataset import generate_dataset, judge_for_manifest
from jaxcap.judges.endpoint import Endpoint
from jaxcap.judges.fleet import JudgeFleet, RoleConfig
from jaxcap.judges.http_judge import HttpJudge
from jaxcap.rewards.overlap import OverlappedReward
from jaxcap.world.judge_server import rule_based_app_for_manifest
from jaxcap.rewards.mix import build_reward
from jaxcap.synthesize_rubrics import main as rubrics_main

ALL_REWARDS = {
  "caprl": {"preset": "released_code"},
  "rubicap": {},
  "balcaprl": {},
  "likert_direct": {},
  "likert_reference": {},
}


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
  return str(generate_dataset(tmp_path_factory.mktemp("judge_world"), 4, seed=3))


@pytest.fixture(scope="module")
def world(manifest):
  records, judge = judge_for_manifest(manifest)
  captions = [r.reference_caption for r in records] + [next(iter(r.teacher_captions.values())) for r in records]
  return records + records, captions, judge


def test_rewards_through_http_equal_in_process_rewards(manifest, world):
  records, captions, direct = world
  with (
    serve_in_thread(rule_based_app_for_manifest(manifest)) as endpoint,
    JudgeFleet({"judge": RoleConfig((endpoint,), max_concurrency=8)}) as fleet,
  ):
    via_http = build_reward(ALL_REWARDS, HttpJudge(fleet))(captions, records, step=2)
    metrics = fleet.metrics()
  expected = build_reward(ALL_REWARDS, direct)(captions, records, step=2)
  assert via_http.names == expected.names
  np.testing.assert_array_equal(via_http.valid, expected.valid)
  np.testing.assert_allclose(via_http.values, expected.values)
  assert via_http.valid.all() and not via_http.failed_judgments
  assert metrics["judge/judge/failed_judgments"] == 0
  assert metrics["judge/judge/requests"] + metrics["judge/judge/cache_hits"] == metrics["judge/judge/judgments"]
  assert metrics["judge/judge/prompt_tokens"] > 0 and metrics["judge/judge/completion_tokens"] > 0
  assert 0 < metrics["judge/judge/latency_p50_s"] <= metrics["judge/judge/latency_p99_s"]


def test_repeated_questions_are_served_from_cache(manifest, world):
  records, captions, _ = world
  with (
    serve_in_thread(rule_based_app_for_manifest(manifest)) as endpoint,
    JudgeFleet({"judge": RoleConfig((endpoint,))}) as fleet,
  ):
    reward = build_reward({"caprl": {}}, HttpJudge(fleet))
    first = reward(captions, records, step=0)
    sent = fleet.metrics()["judge/judge/requests"]
    second = reward(captions, records, step=0)  # same draws: same prompts and params
    m = fleet.metrics()
    stats = httpx.get(endpoint.url.replace("/v1", "/stats")).json()
  np.testing.assert_array_equal(first.values, second.values)
  assert m["judge/judge/requests"] == sent == stats["requests"]
  assert m["judge/judge/cache_hits"] == m["judge/judge/judgments"] / 2


def test_concurrency_is_bounded_and_used(manifest, world):
  records, captions, _ = world
  with (
    serve_in_thread(rule_based_app_for_manifest(manifest, added_latency_s=0.05)) as endpoint,
    JudgeFleet({"answerer": RoleConfig((endpoint,), max_concurrency=3)}) as fleet,
  ):
    start = time.perf_counter()
    build_reward({"caprl": {"questions_per_caption": 3}}, HttpJudge(fleet))(captions, records)
    elapsed = time.perf_counter() - start
    stats = httpx.get(endpoint.url.replace("/v1", "/stats")).json()
  requests = len(captions) * 3
  assert stats["peak_in_flight"] == 3  # used the bound, never above it
  assert elapsed < requests * 0.05  # below the serial time (the peak above is the real check)


def test_injected_judge_failures_are_masked_and_counted_like_in_process(manifest, world):
  records, captions, _ = world
  _, failing = judge_for_manifest(manifest, failure_rate=0.3, seed=1)
  with (
    serve_in_thread(rule_based_app_for_manifest(manifest, failure_rate=0.3, seed=1)) as endpoint,
    JudgeFleet({"judge": RoleConfig((endpoint,))}) as fleet,
  ):
    via_http = build_reward(ALL_REWARDS, HttpJudge(fleet))(captions, records, step=1)
    metrics = fleet.metrics()
  expected = build_reward(ALL_REWARDS, failing)(captions, records, step=1)
  assert via_http.failed_judgments == expected.failed_judgments and sum(expected.failed_judgments.values()) > 0
  np.testing.assert_array_equal(via_http.valid, expected.valid)
  assert (~via_http.valid).any()
  assert (via_http.values[~via_http.valid] == 0).all()  # placeholders only, masked
  # A refused judgment (HTTP 422) is final: no retries, no breaker trips.
  assert metrics["judge/judge/failures/http_status"] == metrics["judge/judge/failed_judgments"]


def test_overlapped_reward_returns_a_future_of_the_same_batch(manifest, world):
  records, captions, direct = world
  with (
    serve_in_thread(rule_based_app_for_manifest(manifest, added_latency_s=0.02)) as endpoint,
    JudgeFleet({"judge": RoleConfig((endpoint,))}) as fleet,
    OverlappedReward(build_reward({"balcaprl": {}}, HttpJudge(fleet))) as overlapped,
  ):
    future = overlapped.submit(captions, records, step=0)
    assert not future.done()  # returned before the judge answered
    batch = future.result(timeout=60)
  np.testing.assert_allclose(batch.values, build_reward({"balcaprl": {}}, direct)(captions, records).values)


def test_api_key_from_env_is_sent_and_a_missing_key_fails_without_retry(monkeypatch):
  app = fixed_reply_app('{"passed": true}')
  from jaxcap.judges.protocol import CriterionRequest

  with serve_in_thread(app) as endpoint:
    keyed = Endpoint(endpoint.url, api_key_env="JAXCAP_JUDGE_KEY")
    monkeypatch.setenv("JAXCAP_JUDGE_KEY", "sk-test-987")
    with JudgeFleet({"judge": RoleConfig((keyed,))}) as fleet:
      ok = HttpJudge(fleet).check_criteria([CriterionRequest("i", "c", "crit")])
    assert ok[0].passed and not ok[0].failed and app.state.auth == ["Bearer sk-test-987"]
    monkeypatch.delenv("JAXCAP_JUDGE_KEY")
    with JudgeFleet({"judge": RoleConfig((keyed,))}) as fleet:
      missing = HttpJudge(fleet).check_criteria([CriterionRequest("i", "c", "crit2")])
      metrics = fleet.metrics()
    assert missing[0].failed and "JAXCAP_JUDGE_KEY" in missing[0].error
    assert "sk-test" not in missing[0].error and "sk-test" not in json.dumps(metrics)
    assert app.state.requests == 1  # nothing sent without the key


def test_curate_qa_and_synthesize_rubrics_over_http_match_rule_based(manifest, tmp_path, capsys):
  with serve_in_thread(rule_based_app_for_manifest(manifest)) as endpoint:
    assert curate_main(["--manifest", manifest, "--out", str(tmp_path / "http.jsonl"), "--endpoint", endpoint.url]) == 0
    assert rubrics_main(["--manifest", manifest, "--out", str(tmp_path / "rub_http"), "--endpoint", endpoint.url]) == 0
  assert curate_main(["--manifest", manifest, "--out", str(tmp_path / "rule.jsonl"), "--rule-based"]) == 0
  assert rubrics_main(["--manifest", manifest, "--out", str(tmp_path / "rub_rule"), "--rule-based"]) == 0
  http_rows = [json.loads(line) for line in open(tmp_path / "http.jsonl")]
  rule_rows = [json.loads(line) for line in open(tmp_path / "rule.jsonl")]
  assert [r["questions"] for r in http_rows] == [r["questions"] for r in rule_rows]
  assert sum(len(r["questions"]) for r in rule_rows) > 0  # the world's questions pass their own filter
  http_rubrics = sorted(p.read_text() for p in (tmp_path / "rub_http").glob("*.json"))
  assert http_rubrics == sorted(p.read_text() for p in (tmp_path / "rub_rule").glob("*.json"))
  assert len(http_rubrics) == 4
  capsys.readouterr()
  # Resumable: a second run finds every rubric stored and asks nothing.
  assert rubrics_main(["--manifest", manifest, "--out", str(tmp_path / "rub_rule"), "--rule-based"]) == 0
  summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert summary["written"] == 0 and summary["already_stored"] == 4
