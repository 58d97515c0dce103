"""The judge preflight: before any compute, every endpoint of every configured role answers one real judgment
through the run's own client path; each way of being unreachable is one error naming the role, the endpoint,
the cause and the fix."""

import json
import re

import httpx
import pytest
from judge_servers import closed_port_url, fixed_reply_app, serve_in_thread, slow_app

from jaxcap.world.dataset import generate_dataset, judge_for_manifest
from jaxcap.judges.factory import build_judge
from jaxcap.judges.settings import JudgeConfig
from jaxcap.judges.preflight import JudgePreflightError, preflight_judge
from jaxcap.world.judge_server import rule_based_app_for_manifest

KEY = "s3cret-key"
HEAD = "Judge preflight failed for 1 endpoint check(s); nothing was run:\n  - "
TAIL = "\n(judge.preflight=False skips this check.)"


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
  return str(generate_dataset(tmp_path_factory.mktemp("preflight_world"), 4, seed=3))


@pytest.fixture(scope="module")
def records(manifest):
  return judge_for_manifest(manifest)[0]


@pytest.fixture(scope="module")
def keyed_server(manifest):
  with serve_in_thread(rule_based_app_for_manifest(manifest, api_key=KEY)) as endpoint:
    yield endpoint


def _preflight(records, **overrides):
  config = JudgeConfig(**{"kind": "http", "api_key_env": "JAXCAP_TEST_JUDGE_KEY", "timeout_s": 5.0, **overrides})
  judge = build_judge(config, records=records)
  try:
    return preflight_judge(judge, config, records=records)
  finally:
    judge.fleet.close()


def _names(message, url, cause, *fixes):
  """`message` is the preflight's error for one failed check: the role and endpoint, the cause and each fix."""
  assert message.startswith(HEAD) and message.endswith(TAIL), message
  [check] = message[len(HEAD) : -len(TAIL)].split("\n  - ")
  assert check.startswith(f"role 'judge' at {url}: ") and cause in check.split("Fix: ")[0], check
  assert all(fix in check.split("Fix: ", 1)[1] for fix in fixes), check


def _stats(endpoint):
  return httpx.get(endpoint.url.replace("/v1", "/stats"), headers={"Authorization": f"Bearer {KEY}"}).json()


def test_unset_key_variable_is_named_with_the_fix_and_nothing_is_sent(keyed_server, records, monkeypatch):
  monkeypatch.delenv("JAXCAP_TEST_JUDGE_KEY", raising=False)
  before = _stats(keyed_server)["requests"]
  with pytest.raises(JudgePreflightError) as e:
    _preflight(records, endpoints=keyed_server.url)
  cause = "JAXCAP_TEST_JUDGE_KEY (judge.api_key_env) is not set"
  _names(str(e.value), keyed_server.url, cause, "export JAXCAP_TEST_JUDGE_KEY=", "judge.api_key_env=''")
  assert _stats(keyed_server)["requests"] == before


def test_closed_port(records, monkeypatch):
  monkeypatch.setenv("JAXCAP_TEST_JUDGE_KEY", KEY)
  url = closed_port_url()
  with pytest.raises(JudgePreflightError) as e:
    _preflight(records, endpoints=url)
  _names(str(e.value), url, "cannot connect (ConnectError: ", "launch/judge_fleet.sh", "judge.endpoints")


def test_wrong_model_name_lists_the_served_ones(keyed_server, records, monkeypatch):
  monkeypatch.setenv("JAXCAP_TEST_JUDGE_KEY", KEY)
  with pytest.raises(JudgePreflightError) as e:
    _preflight(records, endpoints=keyed_server.url, model="Qwen/Qwen2.5-7B-Instruct")
  message = str(e.value)
  _names(
    message, keyed_server.url, "model 'Qwen/Qwen2.5-7B-Instruct' is not served here (HTTP 404)", "judge.model=judge"
  )
  assert "serves ['judge']" in message  # the served names
  _names(message, keyed_server.url, "", "--served-model-name Qwen/Qwen2.5-7B-Instruct", "SERVED_NAME=")


def test_wrong_key_and_no_key_get_401(keyed_server, records, monkeypatch):
  monkeypatch.setenv("JAXCAP_TEST_JUDGE_KEY", "not-the-key")
  with pytest.raises(JudgePreflightError) as e:
    _preflight(records, endpoints=keyed_server.url)
  cause = "refused the API key in $JAXCAP_TEST_JUDGE_KEY (HTTP 401)"
  _names(str(e.value), keyed_server.url, cause, "export JAXCAP_TEST_JUDGE_KEY=")
  with pytest.raises(JudgePreflightError) as e:
    _preflight(records, endpoints=keyed_server.url, api_key_env="")
  cause = "requires an API key (HTTP 401) and judge.api_key_env is empty"
  _names(str(e.value), keyed_server.url, cause, "export JUDGE_API_KEY=", "judge.api_key_env=JUDGE_API_KEY")


def test_unparseable_reply(records):
  with serve_in_thread(fixed_reply_app("I would rather not say.")) as chatty:
    with pytest.raises(JudgePreflightError) as e:
      _preflight(records, endpoints=chatty.url, api_key_env="")
  message = str(e.value)
  _names(message, chatty.url, "the reply cannot be used", "judge.endpoints", "judge.model", "judge.structured_output")
  assert "'I would rather not say.'" in message and "after 2 asks" in message  # the reply, asked twice


def test_timeout(records):
  with serve_in_thread(slow_app(1.0)) as slow:
    with pytest.raises(JudgePreflightError) as e:
      _preflight(records, endpoints=slow.url, api_key_env="", timeout_s=0.3)
  _names(str(e.value), slow.url, "no reply within 0.3 s", "GET /v1/models", "raise judge.timeout_s")


def test_every_endpoint_of_every_role_answers_one_judgment(manifest, keyed_server, records, tmp_path, monkeypatch):
  monkeypatch.setenv("JAXCAP_TEST_JUDGE_KEY", KEY)
  dead = closed_port_url()
  with serve_in_thread(rule_based_app_for_manifest(manifest, api_key=KEY)) as second:
    key = {"api_key_env": "JAXCAP_TEST_JUDGE_KEY"}
    roles = {
      "answerer": {"endpoints": [{"url": keyed_server.url, **key}, {"url": second.url, **key}]},
      "verifier": {"endpoints": [{"url": second.url, **key}], "send_images": True},
      "rubric_writer": {"endpoints": [{"url": second.url, **key}, {"url": dead, **key}], "timeout_s": 5.0},
    }
    (tmp_path / "fleet.json").write_text(json.dumps(roles))
    before = (_stats(keyed_server)["requests"], _stats(second)["requests"])
    with pytest.raises(JudgePreflightError) as e:
      _preflight(records, fleet_config=str(tmp_path / "fleet.json"))
    after = (_stats(keyed_server)["requests"], _stats(second)["requests"])
    roles["rubric_writer"]["endpoints"].pop()
    (tmp_path / "fleet.json").write_text(json.dumps(roles))
    assert _preflight(records, fleet_config=str(tmp_path / "fleet.json")) is not None
  assert str(e.value).startswith(f"{HEAD}role 'rubric_writer' at {dead}: cannot connect (ConnectError: ")
  # one probe per (role, endpoint): answerer on both servers, verifier and rubric_writer on the second
  assert (after[0] - before[0], after[1] - before[1]) == (1, 3)


def test_in_process_and_disabled_preflights_send_nothing(records):
  rule = build_judge(JudgeConfig(), scenes={"x": None}, records=records)
  assert preflight_judge(rule, JudgeConfig()) is rule
  config = JudgeConfig(kind="http", endpoints=closed_port_url(), preflight=False)
  judge = build_judge(config, records=records)
  try:
    assert preflight_judge(judge, config) is judge  # skipped: the closed port is never tried
  finally:
    judge.fleet.close()


def test_eval_cli_runs_the_preflight_before_scoring(manifest, tmp_path):
  from processes import load_config

  config = load_config("eval").to_dict()
  url = closed_port_url()
  config.update(manifest=manifest, suites="captionqa", baselines={}, honest="", out_dir=str(tmp_path / "report"))
  config["judge"].update(kind="http", endpoints=url, api_key_env="")
  from jaxcap.eval.cli import run

  with pytest.raises(JudgePreflightError, match=re.escape(f"role 'judge' at {url}: cannot connect (ConnectError: ")):
    run(config, {"rl": "jsonl:/nonexistent.jsonl"})
  assert not (tmp_path / "report").exists()
