"""The judge server under hostile or careless clients (issue 30, case 5): connections that never send a request,
or stall in their head or body, are closed by uvicorn's limits (`jaxcap.judges.serving.server_config`); the
connection cap answers 503 beyond it; judging runs in a worker pool, so one expensive request does not stall the
others. benchmarks/judge_server_load.py runs the issue's numbers (1,000 requests at 200 concurrent, 300 idle
connections, a 15 MB request)."""

import json
import socket
import threading
import time

import httpx
from judge_servers import HOST, serve_in_thread

from jaxcap.judges.server import make_app

EXPENSIVE = "EXPENSIVE"  # a caption the fake judge takes 1 s of blocking work over (a 15 MB caption's stand-in)
WORK_S = 1.0


class BlockingBackend:
  """Answers "A"; blocks its thread for WORK_S on a caption holding EXPENSIVE (CPU work the loop cannot share)."""

  def reply(self, primitive, request):
    if EXPENSIVE in request.caption:
      time.sleep(WORK_S)
    return "A"


def _body(caption: str) -> bytes:
  hint = {
    "primitive": "answer_multiple_choice",
    "request": {"image_id": "img", "caption": caption, "question": "Which?", "options": ["red", "blue"]},
  }
  return json.dumps(
    {"model": "judge", "messages": [{"role": "user", "content": caption}], "jaxcap_request": hint}
  ).encode()


def _served(**limits):
  from jaxcap.judges.serving import server_config

  app = make_app(BlockingBackend(), body_timeout_s=limits.pop("body_timeout_s", 30.0))
  return serve_in_thread(app, server_config(app, HOST, 0, log_level="error", **limits))


def _connect(endpoint, send: bytes = b"") -> socket.socket:
  url = httpx.URL(endpoint.url)
  s = socket.create_connection((url.host, url.port), timeout=5)
  if send:
    s.sendall(send)
  return s


def _closed_by_server(s: socket.socket) -> bool:
  try:
    return s.recv(65536) == b"" or s.recv(65536) == b""  # (a 4xx reply may come first)
  except (ConnectionResetError, TimeoutError):
    return False


def test_connections_that_send_nothing_or_stall_in_their_head_are_closed():
  with _served(header_timeout_s=0.5, idle_timeout_s=1) as endpoint:
    silent = [_connect(endpoint) for _ in range(10)]
    partial = [_connect(endpoint, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n") for _ in range(10)]
    with httpx.Client() as client:  # meanwhile a real client is served, and its kept-alive connection idles
      assert client.post(endpoint.chat_url, content=_body("a red circle")).json()["choices"][0]["message"] == {
        "role": "assistant",
        "content": "A",
      }
      start = time.monotonic()
      closed = [_closed_by_server(s) for s in silent + partial]
      waited = time.monotonic() - start
    for s in silent + partial:
      s.close()
  assert closed == [True] * 20 and waited < 4  # all closed by the 0.5 s head deadline, not the 5 s socket timeout


def test_a_body_that_stalls_gets_408():
  with _served(body_timeout_s=0.3) as endpoint:
    head = (
      b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    )
    s = _connect(endpoint, head + b'{"model": ')
    reply = s.recv(65536).decode()
    s.close()
  assert reply.startswith("HTTP/1.1 408 ") and "request body not received within 0.3 s (10 bytes came)" in reply


def test_the_connection_cap_answers_503_beyond_it():
  with _served(max_connections=4, header_timeout_s=30) as endpoint:
    held = [_connect(endpoint) for _ in range(4)]
    time.sleep(0.2)  # accepted
    status = httpx.post(endpoint.chat_url, content=_body("a red circle")).status_code
    for s in held:
      s.close()
    time.sleep(0.2)
    after = httpx.post(endpoint.chat_url, content=_body("a red circle")).status_code
  assert (status, after) == (503, 200)


def test_one_expensive_request_does_not_stall_the_others():
  done: dict[str, float] = {}
  with _served() as endpoint:
    with httpx.Client(timeout=30) as client:
      client.post(endpoint.chat_url, content=_body("warm up"))

      def post(name, caption):
        assert client.post(endpoint.chat_url, content=_body(caption)).status_code == 200
        done[name] = time.monotonic()

      big = threading.Thread(target=post, args=("big", f"a red circle {EXPENSIVE}"))
      big.start()
      time.sleep(0.2)  # the expensive one is being judged
      small = [threading.Thread(target=post, args=(f"small{i}", f"circle {i}")) for i in range(8)]
      for t in small:
        t.start()
      for t in [big, *small]:
        t.join()
  assert len(done) == 9 and all(done[f"small{i}"] < done["big"] for i in range(8))  # answered while it worked
