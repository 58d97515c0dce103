"""The rule-based judge server refuses bad requests with a JSON error and a 4xx status — never a 500, which
clients retry — limits the body size, checks an optional bearer token, and the client sends a request id in its
header, not the request, so a 100 kB caption is judged like a short one."""

import asyncio
import json
import re

import httpx
import pytest
from judge_servers import fixed_reply_app, serve_in_thread

from jaxcap.world.dataset import generate_dataset, judge_for_manifest
from jaxcap.judges.endpoint import Endpoint
from jaxcap.judges.fleet import JudgeFleet, RoleConfig
from jaxcap.judges.http_judge import HttpJudge
from jaxcap.judges.protocol import MultipleChoiceRequest
from jaxcap.world.judge_server import rule_based_app_for_manifest

KEY = "s3cret-key"
AUTH = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
MESSAGES = [{"role": "user", "content": "Which colour?"}]
MCQ = {"image_id": "img", "caption": "A red circle.", "question": "What colour is the circle?", "options": ["red", "b"]}


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
  return str(generate_dataset(tmp_path_factory.mktemp("server_world"), 4, seed=3))


@pytest.fixture(scope="module")
def server(manifest):
  """The rule-based server with a bearer token and a 1 MiB body limit."""
  with serve_in_thread(rule_based_app_for_manifest(manifest, api_key=KEY, max_body_bytes=2**20)) as endpoint:
    yield endpoint


def _body(**fields):
  return json.dumps({"model": "judge", "messages": MESSAGES, **fields}).encode()


def _hint(primitive="answer_multiple_choice", **request):
  return {"primitive": primitive, "request": {**MCQ, **request}}


BAD_REQUESTS = [
  (
    b"{bad json",
    400,
    "request body is not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
  ),
  (b"\xff\xfe not utf-8", 400, "request body is not valid JSON: Expecting value: line 1 column 1 (char 0)"),
  (b"[1, 2]", 422, "request body must be a JSON object, got list"),
  (json.dumps({"model": 3, "messages": MESSAGES}).encode(), 422, "model: expected a string, got int"),
  (json.dumps({"messages": "hi"}).encode(), 422, "messages: expected a non-empty list of {role, content} objects"),
  (
    json.dumps({"messages": [{"role": 1}]}).encode(),
    422,
    "messages[0]: role must be a string and content a string or a list of parts",
  ),
  (_body(model="gpt-9"), 404, "The model `gpt-9` does not exist; this server serves ['judge']"),
  (
    _body(),
    400,
    "the rule-based judge needs the 'jaxcap_request' body field that jaxcap's HttpJudge sends "
    "(RoleConfig.request_hint='auto' or 'always'); it cannot read free-form prompts",
  ),
  (_body(jaxcap_request=[1]), 422, "jaxcap_request must be an object, got list"),
  (
    _body(jaxcap_request={"primitive": "rm -rf"}),
    422,
    "jaxcap_request.primitive: unknown primitive 'rm -rf'; "
    "known: ['answer_multiple_choice', 'answer_visual_questions', 'check_criteria', 'compare_captions', "
    "'match_reference_units', 'rate_language', 'score_likert', 'split_claims', 'verify_claims', 'write_criteria']",
  ),
  (_body(jaxcap_request=_hint(image_id=7)), 422, "jaxcap_request.request.image_id: expected a string, got int"),
  (_body(jaxcap_request=_hint(options="ab")), 422, "jaxcap_request.request.options: expected a list, got str"),
  (
    _body(jaxcap_request=_hint(options=["a", None])),
    422,
    "jaxcap_request.request.options[1]: expected a string, got NoneType",
  ),
  (
    _body(jaxcap_request={"primitive": "check_criteria", "request": {"image_id": "i", "caption": "c"}}),
    422,
    "jaxcap_request.request: missing field 'criterion' for check_criteria",
  ),
  (_body(jaxcap_request=_hint(options=["only one"])), 422, "the judge gave no judgment: 1 options; need 2..9"),
  # a body nested past the JSON parser's depth limit (a RecursionError inside it was a 500)
  (
    b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    400,
    "request body nests too deeply to parse; a chat request is a few levels deep",
  ),
]


@pytest.mark.parametrize("body, status, message", BAD_REQUESTS, ids=[m[:40] for _, _, m in BAD_REQUESTS])
def test_bad_requests_get_a_json_4xx_never_a_500(server, body, status, message):
  r = httpx.post(server.chat_url, content=body, headers=AUTH)
  assert (r.status_code, r.json()["error"]["message"]) == (status, message)
  assert r.headers["content-type"] == "application/json" and "Traceback" not in r.text


def test_a_good_request_is_answered(server):
  r = httpx.post(server.chat_url, content=_body(jaxcap_request=_hint()), headers=AUTH)
  assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "A"


def test_bodies_over_the_limit_get_413_with_or_without_content_length(server):
  big = _body(jaxcap_request=_hint(caption="x" * (2**20 + 1)))
  r = httpx.post(server.chat_url, content=big, headers=AUTH)
  assert r.status_code == 413
  assert r.json()["error"]["message"] == f"request body of {len(big)} bytes exceeds the limit of 1048576 bytes"
  chunks = (big[i : i + 65536] for i in range(0, len(big), 65536))  # chunked: no Content-Length
  r = httpx.post(server.chat_url, content=chunks, headers=AUTH)
  assert r.status_code == 413 and r.json()["error"]["message"] == "request body exceeds the limit of 1048576 bytes"


def test_bearer_token_is_checked_on_v1_and_stats_but_not_health(server):
  stats = server.url.replace("/v1", "/stats")
  no_key = httpx.post(server.chat_url, content=_body(jaxcap_request=_hint()))
  wrong = httpx.get(server.models_url, headers={"Authorization": "Bearer nope"})
  fix = "send 'Authorization: Bearer <key>' with the key this server was started with (client: export the variable "
  assert (no_key.status_code, wrong.status_code, httpx.get(stats).status_code) == (401, 401, 401)
  assert no_key.json()["error"]["message"] == "no Authorization header: " + fix + "judge.api_key_env names)"
  assert wrong.json()["error"]["message"] == "wrong API key: " + fix + "judge.api_key_env names)"
  assert wrong.headers["www-authenticate"] == "Bearer"
  assert httpx.get(server.url.replace("/v1", "/health")).json() == {"status": "ok"}
  assert httpx.get(server.models_url, headers=AUTH).json()["data"][0]["id"] == "judge"
  refused = httpx.get(stats, headers=AUTH).json()["refused"]
  assert refused["401"] >= 1 and "500" not in refused


def test_a_100_kB_caption_is_judged_and_the_header_carries_only_a_request_id(manifest, monkeypatch):
  records, direct = judge_for_manifest(manifest)
  caption = (records[0].reference_caption + " ") * (100_000 // (len(records[0].reference_caption) + 1) + 1)
  assert len(caption) >= 100_000
  request = MultipleChoiceRequest(records[0].id, caption, "What colour is the circle?", ("red", "blue", "green"))
  app = fixed_reply_app("B")  # records the headers
  with serve_in_thread(app) as plain, JudgeFleet({"judge": RoleConfig((plain,))}) as fleet:
    (reply,) = HttpJudge(fleet).answer_multiple_choice([request])
  (headers,) = app.state.headers
  assert "circle" not in json.dumps(headers) and sum(len(k) + len(v) for k, v in headers.items()) < 500
  assert reply.reply == "B" and re.fullmatch(
    r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", headers["x-request-id"]
  )
  monkeypatch.setenv("JAXCAP_TEST_JUDGE_KEY", KEY)
  with serve_in_thread(rule_based_app_for_manifest(manifest, api_key=KEY)) as server:
    keyed = Endpoint(server.url, api_key_env="JAXCAP_TEST_JUDGE_KEY")
    with JudgeFleet({"judge": RoleConfig((keyed,))}) as fleet:
      (reply,) = HttpJudge(fleet).answer_multiple_choice([request])
  assert not reply.failed, reply.error
  assert reply.reply == direct.answer_multiple_choice([request])[0].reply


def test_no_5xx_under_concurrent_load(server):
  """200 requests, 50 at a time (benchmarks/judge_server_load.py runs 1,000 at 200)."""

  async def run():
    limits = httpx.Limits(max_connections=50)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
      gate = asyncio.Semaphore(50)

      async def one(i):
        async with gate:
          body = _body(jaxcap_request=_hint(caption=f"A red circle number {i}."))
          return (await client.post(server.chat_url, content=body, headers=AUTH)).status_code

      return await asyncio.gather(*(one(i) for i in range(200)))

  statuses = asyncio.run(run())
  assert statuses == [200] * 200


def test_request_copy_goes_only_to_servers_that_read_it_and_recovers_when_one_comes_up_late(manifest):
  """A server that was down when the fleet asked GET /models later answers 400 "jaxcap_request_required"; the
  fleet then sends the copy to it (request_hint="auto"), or says how to fix it (request_hint="never")."""
  import socket
  import threading
  import time

  import uvicorn

  from jaxcap.judges.protocol import CriterionRequest

  sock = socket.socket()
  sock.bind(("127.0.0.1", 0))
  url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
  request = [CriterionRequest("img", "A red circle.", "The caption states: a red circle")]
  fast = dict(max_attempts=1, breaker_cooldown_s=0.0)
  with JudgeFleet({"judge": RoleConfig((Endpoint(url),), **fast)}) as fleet:
    with JudgeFleet({"judge": RoleConfig((Endpoint(url),), request_hint="never", **fast)}) as never:
      judge = HttpJudge(fleet)
      assert judge.check_criteria(request)[0].error.startswith("connection: ")  # down: the probe failed too
      server = uvicorn.Server(uvicorn.Config(rule_based_app_for_manifest(manifest), log_level="error"))
      thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
      thread.start()
      while not server.started:
        time.sleep(0.01)
      try:
        (late,) = judge.check_criteria(request)
        (refused,) = HttpJudge(never).check_criteria(request)
      finally:
        server.should_exit = True
        thread.join(timeout=5)
  assert not late.failed and late.passed
  assert "free-form prompts" in refused.error and "request_hint='auto'" in refused.error, refused.error  # the fix
