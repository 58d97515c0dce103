"""uvicorn's settings for a judge server facing many clients (`server_config`): idle kept-alive connections
closed after `timeout_keep_alive`, a request-head deadline and size cap, and a cap on connections / requests in
flight (`limit_concurrency`). The body's deadline and the worker pool are the app's (`jaxcap.judges.server`)."""

from __future__ import annotations

import asyncio

import h11
import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.h11_impl import H11Protocol

DEFAULT_HEADER_TIMEOUT_S = 10.0  # a connection must send a complete request head within this, or is closed
DEFAULT_IDLE_TIMEOUT_S = 5  # a kept-alive connection with no next request is closed after this (uvicorn: int s)
DEFAULT_MAX_CONNECTIONS = 1024  # more open connections or requests in flight get uvicorn's 503
MAX_HEAD_BYTES = 64 * 2**10  # request line + headers


class _HeadDeadlineH11Protocol(H11Protocol):
  """uvicorn's h11 protocol, plus a request-head deadline: a connection that has not sent a complete request
  head within `header_timeout_s` of connecting (or of starting one after a response) is closed, with uvicorn's
  own keep-alive handler. uvicorn's `timeout_keep_alive` starts only after a first response, so without this a
  client that connects and sends nothing, or a slow partial head, holds its connection for ever."""

  header_timeout_s = DEFAULT_HEADER_TIMEOUT_S
  _head_deadline: asyncio.TimerHandle | None = None

  def connection_made(self, transport) -> None:
    super().connection_made(transport)
    self._head_deadline = self.loop.call_later(self.header_timeout_s, self.timeout_keep_alive_handler)

  def data_received(self, data: bytes) -> None:
    super().data_received(data)
    waiting_for_head = self.conn.their_state is h11.IDLE and not self.transport.is_closing()
    if not waiting_for_head and self._head_deadline is not None:
      self._head_deadline.cancel()
      self._head_deadline = None
    elif waiting_for_head and self._head_deadline is None:  # a next request begun after a response
      self._head_deadline = self.loop.call_later(self.header_timeout_s, self.timeout_keep_alive_handler)

  def connection_lost(self, exc) -> None:
    if self._head_deadline is not None:
      self._head_deadline.cancel()
      self._head_deadline = None
    super().connection_lost(exc)


def server_config(
  app: FastAPI,
  host: str = "127.0.0.1",
  port: int = 8100,
  *,
  header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
  idle_timeout_s: int = DEFAULT_IDLE_TIMEOUT_S,
  max_connections: int = DEFAULT_MAX_CONNECTIONS,
  log_level: str = "warning",
) -> uvicorn.Config:
  """uvicorn's settings for a judge server facing many clients: a request head must arrive within
  `header_timeout_s` of connecting (and be at most 64 KiB), idle kept-alive connections close after
  `idle_timeout_s`, and at most `max_connections` connections / requests in flight (beyond: 503). The body's
  deadline is the app's `body_timeout_s`."""
  protocol = type("JudgeH11Protocol", (_HeadDeadlineH11Protocol,), {"header_timeout_s": float(header_timeout_s)})
  return uvicorn.Config(
    app,
    host=host,
    port=port,
    http=protocol,
    timeout_keep_alive=idle_timeout_s,
    limit_concurrency=max_connections,
    h11_max_incomplete_event_size=MAX_HEAD_BYTES,
    log_level=log_level,
    lifespan="off",
  )
