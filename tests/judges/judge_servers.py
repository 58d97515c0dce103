"""Local judge servers for the judge tests (not a test module): the rule-based app on a loopback port in a
thread or a subprocess, and small fault servers. Loopback only."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from typing import Iterator

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse

from jaxcap.judges.endpoint import Endpoint

HOST = "127.0.0.1"


def free_port() -> int:
  with socket.socket() as s:
    s.bind((HOST, 0))
    return s.getsockname()[1]


@contextlib.contextmanager
def serve_in_thread(app: FastAPI, config: uvicorn.Config | None = None) -> Iterator[Endpoint]:
  """Runs `app` with uvicorn (its `config`, default uvicorn's own) on a fresh loopback port; yields its Endpoint
  (".../v1")."""
  sock = socket.socket()
  sock.bind((HOST, 0))
  port = sock.getsockname()[1]
  server = uvicorn.Server(config or uvicorn.Config(app, log_level="error", lifespan="off"))
  thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
  thread.start()
  deadline = time.monotonic() + 10
  while not server.started:
    if time.monotonic() > deadline:
      raise RuntimeError("test server did not start within 10 s")
    time.sleep(0.01)
  try:
    yield Endpoint(f"http://{HOST}:{port}/v1")
  finally:
    server.should_exit = True
    thread.join(timeout=5)
    sock.close()


def closed_port_url() -> str:
  """A loopback /v1 URL nothing listens on (connections are refused)."""
  return f"http://{HOST}:{free_port()}/v1"


def wait_for_models(url: str, timeout_s: float, process: subprocess.Popen | None = None) -> None:
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    if process is not None and process.poll() is not None:
      raise RuntimeError(f"server exited with code {process.returncode} before answering {url}/models")
    try:
      if httpx.get(f"{url}/models", timeout=1.0).status_code == 200:
        return
    except httpx.HTTPError:
      pass
    time.sleep(0.1)
  raise RuntimeError(f"{url}/models did not answer within {timeout_s} s")


@contextlib.contextmanager
def rule_server_process(manifest: str, latency_s: float = 0.0) -> Iterator[tuple[Endpoint, subprocess.Popen]]:
  """`python -m jaxcap.judge serve --rule-based` as a subprocess (so a test can SIGKILL it)."""
  from processes import AS_INSTALLED, start  # here: scripts that import this module may not have tests/ on their path

  port = free_port()
  proc = start(
    [
      *AS_INSTALLED,
      "-m",
      "jaxcap.judge",
      "serve",
      "--rule-based",
      "--manifest",
      manifest,
      "--host",
      HOST,
      "--port",
      str(port),
      "--latency",
      str(latency_s),
      "--api-key-env",
      "",  # no auth, whatever JUDGE_API_KEY the test environment has
    ],
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
    text=False,
  )
  url = f"http://{HOST}:{port}/v1"
  try:
    wait_for_models(url, 30, proc)
    yield Endpoint(url), proc
  finally:
    if proc.poll() is None:
      proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    proc.stderr.close()


def malformed_json_app() -> FastAPI:
  """Answers every chat request 200 with a body that is not JSON."""
  app = FastAPI()

  @app.post("/v1/chat/completions")
  async def chat(request: Request):
    await request.body()
    return PlainTextResponse('{"choices": [{"message": {"content": "A"', media_type="application/json")

  return app


def slow_app(delay_s: float) -> FastAPI:
  """Answers correctly-shaped replies, but only after `delay_s` (past the client's timeout)."""
  app = FastAPI()

  @app.post("/v1/chat/completions")
  async def chat(request: Request):
    await asyncio.sleep(delay_s)
    return {"choices": [{"message": {"role": "assistant", "content": "A"}}]}

  return app


def fixed_reply_app(content: str) -> FastAPI:
  """A well-formed chat response whose content is always `content` (e.g. an unparseable judge reply);
  records the Authorization headers it saw in app.state.auth, all headers in app.state.headers."""
  app = FastAPI()
  app.state.auth = []
  app.state.headers = []  # every request's headers, for checking what travels in them
  app.state.requests = 0

  @app.post("/v1/chat/completions")
  async def chat(request: Request):
    app.state.requests += 1
    app.state.auth.append(request.headers.get("authorization"))
    app.state.headers.append(dict(request.headers))
    return {
      "choices": [{"message": {"role": "assistant", "content": content}}],
      "usage": {"prompt_tokens": 10, "completion_tokens": 2},
    }

  return app


def kill(proc: subprocess.Popen) -> None:
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait(timeout=10)
