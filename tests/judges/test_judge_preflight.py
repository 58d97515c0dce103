"""The judge preflight: before any compute, every endpoint of every configured role answers one real judgment
through the run's own client path; each way of being unreachable is one error naming the role, the endpoint,
the cause and the fix."""

import json
import re

import httpx
import pytest
from judge_servers import closed_port_url, fixed_reply_app, serve_in_thread, slow_app

from jaxcap.world.dataset import generate_dataset, judge_for_manifest
from jaxcap.judges.factory import build_judge, judge_config
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
  config = judge_config(**{"kind": "http", "api_key_env": "JAXCAP_TEST_JUDGE_KEY", "timeout_s": 5.0, **overrides})
  judge = build_judge(config, records=records)
  try:
    return preflight_judge(judge, config, records=records)
  finally:
    judge.fleet.close()


def _stats(endpoint):
  return httpx.get(endpoint.url.replace("/v1", "/stats"), headers={"Authorization": f"Bearer {KEY}"}).json()


def test_unset_key_variable_is_named_with_the_fix_and_nothing_is_sent(keyed_server, records, monkeypatch):
  monkeypatch.delenv("JAXCAP_TEST_JUDGE_KEY", raising=False)
  before = _stats(keyed_server)["requests"]
  with pytest.raises(JudgePreflightError) as e:
    _preflight(records, endpoints=keyed_server.url)
  assert str(e.value) == (
    f"{HEAD}role 'judge' at {keyed_server.url}: the API key variable JAXCAP_TEST_JUDGE_KEY (judge.api_key_env) is "
    "not set, so no request was sent. Fix: export JAXCAP_TEST_JUDGE_KEY=<the key the judge servers were started "
    "with> (launch/judge_fleet.sh and `python -m jaxcap.judge serve` read the same variable), or set "
    f"judge.api_key_env='' for servers without auth{TAIL}"
  )
  assert _stats(keyed_server)["requests"] == before


def test_closed_port(records, monkeypatch):
  monkeypatch.setenv("JAXCAP_TEST_JUDGE_KEY", KEY)
  url = closed_port_url()
  with pytest.raises(JudgePreflightError) as e:
    _preflight(records, endpoints=url)
  assert str(e.value) == (
    f"{HEAD}role 'judge' at {url}: cannot connect (ConnectError: All connection attempts failed). Fix: start the "
    "judge server (launch/judge_fleet.sh, or `python -m jaxcap.judge serve --rule-based ...`) or correct "
    f"judge.endpoints (the server's /v1 base URL, e.g. http://127.0.0.1:8000/v1){TAIL}"
  )


def test_wrong_model_name_lists_the_served_ones(keyed_server, records, monkeypatch):
  monkeypatch.setenv("JAXCAP_TEST_JUDGE_KEY", KEY)
  with pytest.raises(JudgePreflightError) as e:
    _preflight(records, endpoints=keyed_server.url, model="Qwen/Qwen2.5-7B-Instruct")
  assert str(e.value) == (
    f"{HEAD}role 'judge' at {keyed_server.url}: model 'Qwen/Qwen2.5-7B-Instruct' is not served here (HTTP 404); "
    "the server serves ['judge']. Fix: set judge.model=judge (or the role's 'model' in judge.fleet_config), or "
    "start the server with --served-model-name Qwen/Qwen2.5-7B-Instruct (launch/judge_fleet.sh: "
    f"SERVED_NAME=Qwen/Qwen2.5-7B-Instruct){TAIL}"
  )


def test_wrong_key_and_no_key_get_401(keyed_server, records, monkeypatch):
  monkeypatch.setenv("JAXCAP_TEST_JUDGE_KEY", "not-the-key")
  with pytest.raises(JudgePreflightError) as e:
    _preflight(records, endpoints=keyed_server.url)
  assert str(e.value) == (
    f"{HEAD}role 'judge' at {keyed_server.url}: the server refused the API key in $JAXCAP_TEST_JUDGE_KEY "
    f"(HTTP 401). Fix: export JAXCAP_TEST_JUDGE_KEY=<the key this server was started with (its --api-key)>{TAIL}"
  )
  with pytest.raises(JudgePreflightError) as e:
    _preflight(records, endpoints=keyed_server.url, api_key_env="")
  assert str(e.value) == (
    f"{HEAD}role 'judge' at {keyed_server.url}: the server requires an API key (HTTP 401) and judge.api_key_env "
    f"is empty. Fix: export JUDGE_API_KEY=<the server's key> and set judge.api_key_env=JUDGE_API_KEY{TAIL}"
  )


def test_unparseable_reply(records):
  with serve_in_thread(fixed_reply_app("I would rather not say.")) as chatty:
    with pytest.raises(JudgePreflightError) as e:
      _preflight(records, endpoints=chatty.url, api_key_env="")
  assert str(e.value) == (
    f"{HEAD}role 'judge' at {chatty.url}: the reply cannot be used (No JSON object in reply 'I would rather "
    "not say.'. (after 2 asks)). Fix: point judge.endpoints at an OpenAI-compatible /v1 base URL, use an "
    "instruction-tuned judge.model, and let the server constrain replies (judge.structured_output=json_schema for "
    f"vLLM / SGLang, json_object for llama.cpp){TAIL}"
  )


def test_timeout(records):
  with serve_in_thread(slow_app(1.0)) as slow:
    with pytest.raises(JudgePreflightError) as e:
      _preflight(records, endpoints=slow.url, api_key_env="", timeout_s=0.3)
  assert str(e.value) == (
    f"{HEAD}role 'judge' at {slow.url}: no reply within 0.3 s. Fix: the server may still be loading its model (wait "
    f"until GET /v1/models answers), or raise judge.timeout_s{TAIL}"
  )


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
  rule = build_judge(judge_config(), scenes={"x": None}, records=records)
  assert preflight_judge(rule, judge_config()) is rule
  config = judge_config(kind="http", endpoints=closed_port_url(), preflight=False)
  judge = build_judge(config, records=records)
  try:
    assert preflight_judge(judge, config) is judge  # skipped: the closed port is never tried
  finally:
    judge.fleet.close()


def test_eval_cli_runs_the_preflight_before_scoring(manifest, tmp_path):
  import importlib.util
  from pathlib import Path

  spec = importlib.util.spec_from_file_location("eval_config", Path(__file__).parents[2] / "configs" / "eval.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config().to_dict()
  url = closed_port_url()
  config.update(manifest=manifest, suites="captionqa", baselines={}, honest="", out_dir=str(tmp_path / "report"))
  config["judge"].update(kind="http", endpoints=url, api_key_env="")
  from jaxcap.eval.cli import run

  with pytest.raises(JudgePreflightError, match=re.escape(f"role 'judge' at {url}: cannot connect (ConnectError: ")):
    run(config, {"rl": "jsonl:/nonexistent.jsonl"})
  assert not (tmp_path / "report").exists()
