"""The failure budget: judgments that keep failing stop the run after `failure_patience` steps below
`min_valid_fraction`, with the failed judgments counted by kind where they happened (auth, timeout, connection,
http_status, parse) — the run never trains on masked rewards in silence."""

import re

import pytest
from judge_servers import closed_port_url, fixed_reply_app, serve_in_thread, slow_app

from jaxcap.world.dataset import generate_dataset, judge_for_manifest
from jaxcap.rewards.budget import FailureBudget, JudgeFailureBudgetError, judged_reward
from jaxcap.judges.endpoint import Endpoint
from jaxcap.judges.settings import JudgeConfig
from jaxcap.judges.fleet import JudgeFleet, RoleConfig
from jaxcap.judges.http_judge import HttpJudge
from jaxcap.world.judge_server import rule_based_app_for_manifest
from jaxcap.rewards.mix import build_reward
from jaxcap.rewards.overlap import OverlappedReward

FAST = dict(backoff_s=0.01, max_backoff_s=0.02, breaker_cooldown_s=0.2)
CAPRL = {"caprl": {"questions_per_caption": 1}}  # one judgment per caption
TOLERATE = " To tolerate more failures, lower judge.min_valid_fraction (0 = off) or raise judge.failure_patience."


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
  return str(generate_dataset(tmp_path_factory.mktemp("budget_world"), 4, seed=5))


@pytest.fixture(scope="module")
def world(manifest):
  records, _ = judge_for_manifest(manifest)
  captions = [r.reference_caption for r in records]
  return records, captions


def _run_steps(fleet, world, steps, rewards=CAPRL, **budget):
  """Judges the world's captions once per step through the trainer's wrapping; returns the error, if any."""
  records, captions = world
  judge = HttpJudge(fleet)
  reward = judged_reward(build_reward(rewards, judge), judge, JudgeConfig(**budget))
  with OverlappedReward(reward) as overlapped:
    for step in range(steps):
      try:
        overlapped.submit(captions, records, step=step).result(timeout=60)
      except JudgeFailureBudgetError as e:
        return step, str(e)
  return None, ""


def _expected(steps, asked, kinds, hint, last):
  listed = ", ".join(f"{k} {kinds.get(k, 0)}" for k in ("auth", "timeout", "connection", "http_status", "parse"))
  return (
    "Judge failure budget spent: valid judgments stayed below judge.min_valid_fraction=0.5 for 3 consecutive RL "
    f"steps (steps {steps}: 0 of {asked} judgments valid); stopping instead of training on masked rewards. Failed "
    f"judgments by kind: {listed}. Most are {hint}. Last error: {last}.{TOLERATE}"
  )


def test_refused_judgments_stop_the_run_as_http_status(manifest, world):
  with (
    serve_in_thread(rule_based_app_for_manifest(manifest, failure_rate=1.0)) as endpoint,
    JudgeFleet({"answerer": RoleConfig((endpoint,), **FAST)}) as fleet,
  ):
    step, error = _run_steps(fleet, world, 5)
  hint = "http_status: the servers refuse the requests: see the messages in their logs"
  last = f"http_status: {endpoint.url}: HTTP 422: the judge gave no judgment: injected failure"
  assert step == 2 and error == _expected("1-3", 12, {"http_status": 12}, hint, last)


def test_wrong_key_stops_the_run_as_auth(manifest, world, monkeypatch):
  monkeypatch.setenv("JAXCAP_TEST_JUDGE_KEY", "not-the-key")
  with serve_in_thread(rule_based_app_for_manifest(manifest, api_key="the-key")) as endpoint:
    keyed = Endpoint(endpoint.url, api_key_env="JAXCAP_TEST_JUDGE_KEY")
    with JudgeFleet({"answerer": RoleConfig((keyed,), **FAST)}) as fleet:
      step, error = _run_steps(fleet, world, 5)
      sent = fleet.role_metrics("answerer").requests
  hint = "auth: check the API key (export the variable judge.api_key_env names, with the key the servers were "
  hint += "started with)"
  last = (
    f"auth: {endpoint.url}: HTTP 401: wrong API key: send 'Authorization: Bearer <key>' with the key this server "
    "was started with (client: export the variable judge.api_key_env names)"
  )
  assert step == 2 and sent == 12  # an auth failure is final: no retries
  assert error == _expected("1-3", 12, {"auth": 12}, hint, last)


def test_mixed_kinds_are_counted_each_where_they_happened(world):
  """answerer: a closed port (connection, then its breaker opens: still counted as connection); judge: a
  server whose replies never parse (parse); verifier-free rewards: CapRL + Direct-Likert."""
  with (
    serve_in_thread(fixed_reply_app("I would rather not say.")) as chatty,
    JudgeFleet(
      {
        "answerer": RoleConfig((Endpoint(closed_port_url()),), **FAST),
        "judge": RoleConfig((chatty,), parse_attempts=1, **FAST),
      }
    ) as fleet,
  ):
    step, error = _run_steps(fleet, world, 5, {**CAPRL, "likert_direct": {}})
    by_kind = HttpJudge(fleet).failures_by_kind()
    unsent = HttpJudge(fleet).unsent_judgments()
    metrics = fleet.metrics()
  # Behind the closed port's open breaker, a judgment waits for the probe; when the probe fails it is not sent:
  # masked and counted apart, not a failure of a tried request.
  tried = by_kind["connection"]
  assert step == 2 and set(by_kind) == {"connection", "parse"} and by_kind["parse"] == 12
  assert tried >= 3 + 2 and tried + unsent == 12  # the 3 that opened it, a probe per later step
  assert (
    f"(steps 1-3: 0 of {12 + tried} judgments valid; {unsent} more not sent, every endpoint's breaker open)" in error
  )
  assert f"Failed judgments by kind: auth 0, timeout 0, connection {tried}, http_status 0, parse 12. " in error
  assert metrics["judge/answerer/failed/connection"] == tried and metrics["judge/judge/failed/parse"] == 12
  assert metrics["judge/answerer/unsent_judgments"] == unsent


def test_timeouts_behind_an_open_breaker_count_as_timeouts(world):
  with (
    serve_in_thread(slow_app(1.0)) as slow,
    JudgeFleet({"answerer": RoleConfig((slow,), timeout_s=0.2, max_attempts=1, **FAST)}) as fleet,
  ):
    step, error = _run_steps(fleet, world, 5)
    m = fleet.role_metrics("answerer")
  assert m.failures["timeout"] >= 3 and m.failures["all_endpoints_open"] > 0  # the breaker opened after 3
  # step 1: 4 tried (each hedged once); steps 2 and 3: one probe tried, the 3 waiting behind it not sent
  assert m.counts()[:2] == (6, 6) and m.unsent_judgments == 6 and m.failed_judgments == 12
  assert step == 2 and "(steps 1-3: 0 of 6 judgments valid; 6 more not sent, every endpoint's breaker open)" in error
  assert "Failed judgments by kind: auth 0, timeout 6, connection 0, http_status 0, parse 0." in error


def test_refill_rounds_of_one_step_count_as_one_bad_step():
  """rl.filter_groups judges a step's refills in further calls with the same step: patience counts steps."""
  budget = FailureBudget(0.5, patience=2)
  for _ in range(3):
    budget.observe(7, 4, 4, {"timeout": 4})
  assert budget.bad_steps == [7] and budget.failed == 12
  with pytest.raises(JudgeFailureBudgetError, match="steps 7-8: 0 of 16 judgments valid"):
    budget.observe(8, 4, 4, {"timeout": 4})


def test_budget_resets_on_a_good_step_and_ignores_steps_that_asked_nothing():
  budget = FailureBudget(min_valid_fraction=0.5, patience=3)
  assert budget.observe(0, 10, 10, {"timeout": 10}) == 0.0
  assert budget.observe(1, 10, 6, {"timeout": 6}) == 0.4
  assert budget.observe(2, 10, 5, {"timeout": 5}) == 0.5  # at the floor: fine, and the streak is over
  budget.observe(3, 10, 10, {"parse": 10})
  assert budget.observe(4, 0, 0) != budget.observe(4, 0, 0)  # NaN: nothing asked, streak kept
  budget.observe(5, 8, 8, {"parse": 8})
  with pytest.raises(JudgeFailureBudgetError) as e:
    budget.observe(6, 4, 3, {"parse": 2})
  message = str(e.value)
  assert "judge.min_valid_fraction=0.5" in message and "3 consecutive RL steps" in message, message  # the budget
  assert "(steps 3-6: 1 of 22 judgments valid)" in message  # the streak: steps 4 (nothing asked) and 5 kept it
  assert "auth 0, timeout 0, connection 0, http_status 0, parse 20, unclassified 1" in message  # the reasons
  assert "Most are parse" in message and "judge.model" in message and "judge.structured_output" in message
  assert message.endswith(TOLERATE)  # the fix that tolerates more


def test_in_process_judge_failures_count_as_refused_and_zero_turns_the_budget_off(manifest, world):
  records, captions = world
  _, failing = judge_for_manifest(manifest, failure_rate=1.0)
  reward = judged_reward(build_reward(CAPRL, failing), failing, JudgeConfig(failure_patience=1))
  with pytest.raises(
    JudgeFailureBudgetError,
    match=re.escape(
      "judgments by kind: auth 0, timeout 0, connection 0, http_status 0, parse 0, refused 4. Most are refused"
    ),
  ):
    reward(captions, records, step=7)
  off = judged_reward(build_reward(CAPRL, failing), failing, JudgeConfig(min_valid_fraction=0.0))
  for step in range(5):  # never stops, but the step's metrics still say what happened
    batch = off(captions, records, step=step)
  assert not batch.valid.any() and batch.extras["judge/valid_fraction"] == 0.0
  assert batch.extras["judge/failed/refused"] == 4.0 and batch.extras["judge/failed/auth"] == 0.0


@pytest.mark.parametrize(
  "fields, message",
  [
    ({"min_valid_fraction": 1.5}, "judge.min_valid_fraction=1.5: must be in [0, 1]"),
    ({"failure_patience": 0}, "judge.failure_patience=0: must be an integer >= 1 (consecutive RL steps)."),
  ],
)
def test_bad_budget_settings_are_named(fields, message):
  with pytest.raises(ValueError, match=re.escape(message)):
    judged_reward(build_reward(CAPRL, None), None, JudgeConfig(**fields))


def test_processes_agree_on_the_budget_with_summed_counts(monkeypatch, manifest, world):
  """With 2 processes the reward call only records its counts; `settle` (the loop's thread) sums every process's:
  here this process's judgments all fail and the other's all pass, so the global share 0.5 never stops the run,
  and with the other's failing too every process stops at the same step."""
  import jax
  import numpy as np

  import jaxcap.multihost

  records, captions = world
  _, failing = judge_for_manifest(manifest, failure_rate=1.0)
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  for other_fails, stops in ((False, None), (True, 2)):
    seen = []

    def allgather(local, other_fails=other_fails):
      local = np.asarray(local)
      other = local.copy() if other_fails else np.concatenate([[local[0]], np.zeros_like(local[1:])])
      seen.append(local.tolist())
      return [local, other]

    monkeypatch.setattr(jaxcap.multihost, "allgather_ints", allgather)
    reward = judged_reward(build_reward(CAPRL, failing), failing, JudgeConfig(failure_patience=3))
    stopped = None
    for step in range(4):
      reward(captions, records, step=step)  # never raises on the reward thread
      try:
        reward.settle()
      except JudgeFailureBudgetError as e:
        stopped = step
        assert f"0 of {6 * len(records)} judgments valid" in str(e)
        break
    assert stopped == stops and seen and all(s[0] == len(records) and s[1] == len(records) for s in seen)


def test_settle_takes_the_calls_in_order(monkeypatch, manifest, world):
  """rl.max_staleness: the next steps' calls may finish before this step's settle; each settle agrees the oldest
  unsettled call's counts, so the budget sees every step once, in order."""
  import jax
  import numpy as np

  import jaxcap.multihost

  records, captions = world
  _, failing = judge_for_manifest(manifest, failure_rate=1.0)
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  monkeypatch.setattr(jaxcap.multihost, "allgather_ints", lambda local: [np.asarray(local)] * 2)
  reward = judged_reward(build_reward(CAPRL, failing), failing, JudgeConfig(failure_patience=3))
  reward(captions, records, step=0)
  reward(captions, records, step=1)  # before step 0's settle
  reward.settle()
  assert reward.budget.bad_steps == [1]
  reward.settle()
  assert reward.budget.bad_steps == [1, 2]
  reward.settle()  # nothing left: a no-op
  assert reward.budget.bad_steps == [1, 2]
