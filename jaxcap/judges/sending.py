"""How one judgment's requests are sent (event-loop side of `JudgeFleet`): each ask hedged once when it is slow
(`send_hedged`), retried with backoff and full jitter for connection errors, 5xx and malformed replies
(`send_with_retries`, tenacity), and sent to the endpoint its role's pool gives (`send_once`), with the
structured request copy for servers that read it."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Mapping

import httpx
import tenacity

from jaxcap.judges.chat_client import HINT_FIELD, HINT_REQUIRED, ChatReply, EndpointError, get_models, post_chat
from jaxcap.judges.pool import NOT_SENT, EndpointState, RolePool
from jaxcap.judges.roles import JudgeCall, RoleConfig


async def send_with_retries(
  client: httpx.AsyncClient, pool: RolePool, call: JudgeCall, params: Mapping[str, Any], tries: "Tries"
) -> ChatReply:
  """One reply: each ask hedged (`send_hedged`); connection errors, 5xx and malformed replies retried with
  backoff up to max_attempts sends. Timeouts are not retried here: the hedge is their one re-ask."""
  cfg = pool.config
  asked = {"messages": list(call.messages)} if call.prompt is None else {"prompt": call.prompt}
  body: dict[str, Any] = {**asked, **params}
  if call.schema is not None and cfg.structured_output == "json_schema":
    body["response_format"] = {
      "type": "json_schema",
      "json_schema": {"name": "judgment", "schema": dict(call.schema)},
    }
  elif call.schema is not None and cfg.structured_output == "json_object":
    body["response_format"] = {"type": "json_object", "schema": dict(call.schema)}
  retrying = tenacity.AsyncRetrying(
    stop=tenacity.stop_after_attempt(cfg.max_attempts),
    wait=tenacity.wait_random_exponential(multiplier=cfg.backoff_s, max=cfg.max_backoff_s),
    retry=tenacity.retry_if_exception(lambda e: isinstance(e, EndpointError) and e.retryable and e.kind != "timeout"),
    reraise=True,
  )
  async for attempt in retrying:
    with attempt:
      return await send_hedged(client, pool, body, call.hint, tries)
  raise AssertionError("unreachable: tenacity reraises the last error")


async def send_hedged(
  client: httpx.AsyncClient,
  pool: RolePool,
  body: Mapping[str, Any],
  hint: Mapping[str, Any] | None,
  tries: "Tries",
) -> ChatReply:
  """One request; when it has no answer after the role's hedge delay, a second copy goes to another endpoint
  (the same one when the role has one) and the first answer wins, the other copy is cancelled. Raises the
  first copy's error when both fail."""
  delay = pool.config.hedge_delay_s()
  first = asyncio.ensure_future(send_once(client, pool, body, hint, tries))
  if delay is None:
    return await first
  done, _ = await asyncio.wait({first}, timeout=delay)
  if done:
    return first.result()
  second = asyncio.ensure_future(send_once(client, pool, body, hint, tries, avoid=tries.last, hedge=True))
  pending, errors = {first, second}, {}
  try:
    while pending:
      done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
      for task in done:
        if task.exception() is None:
          return task.result()
        errors[task] = task.exception()
    raise errors[first] if not getattr(errors[first], "kind", "") == NOT_SENT else errors[second]
  finally:
    for task in pending:
      task.cancel()
    if pending:
      await asyncio.gather(*pending, return_exceptions=True)


async def wants_hint(client: httpx.AsyncClient, state: EndpointState, config: RoleConfig) -> bool:
  """Whether this endpoint reads the structured request copy: asked once per endpoint (GET /models)."""
  if state.hint is None:
    assert state.probe is not None
    async with state.probe:
      if state.hint is None:
        try:
          models = await get_models(client, state.endpoint, min(config.timeout_s, 10.0))
          state.hint = any(m.get(HINT_FIELD) for m in models)
        except EndpointError:
          state.hint = False  # the chat request reports what is wrong; a 400 asking for the copy turns it on
  return state.hint


async def send_once(
  client: httpx.AsyncClient,
  pool: RolePool,
  body: Mapping[str, Any],
  hint: Mapping[str, Any] | None,
  tries: "Tries",
  avoid: EndpointState | None = None,
  hedge: bool = False,
) -> ChatReply:
  """One request to the endpoint `pool.acquire` gives. A hedge's failure is no verdict on its endpoint (it
  copies a request that was already slow; unless it went as the half-open probe)."""
  assert pool.semaphore is not None
  async with pool.semaphore:
    try:
      state = await pool.acquire(avoid)
    except EndpointError as e:
      pool.metrics.record(failure=e.kind)
      raise
    url = state.endpoint.url
    state.outstanding += 1
    send = state.breaker.on_send()
    tries.sent, tries.last = True, state
    pool.metrics.record_request_start(url)
    pool.metrics.record(hedge=hedge)  # counted as it goes out: a copy cancelled while it queued was never sent
    try:
      try:
        with_hint = hint is not None and await wants_hint(client, state, pool.config)
        sent = {**body, HINT_FIELD: dict(hint)} if with_hint else body
        reply = await post_chat(client, state.endpoint, sent, pool.config.timeout_s)
      except EndpointError as e:
        if not (hint is not None and not with_hint and e.status == 400 and HINT_REQUIRED in e.body):
          raise
        if pool.config.request_hint == "never":
          raise EndpointError(
            e.kind,
            f"{e} (the server needs the structured request copy; set request_hint='auto' for this role)",
            retryable=False,
            status=e.status,
            body=e.body,
          ) from None
        state.hint = True  # the rule-based server came up after the first probe: send the copy from now on
        reply = await post_chat(client, state.endpoint, {**body, HINT_FIELD: dict(hint)}, pool.config.timeout_s)
    except EndpointError as e:
      # A refused request (4xx) says nothing about the endpoint's health.
      if e.retryable and (not hedge or send.probe):
        state.breaker.on_failure(send)
        state.last_failure = e.kind
      elif e.retryable:
        state.breaker.on_cancel(send)
      else:
        state.breaker.on_success(send)
      pool.metrics.record_request_end(url, failure=e.kind)
      pool.changed()
      raise
    except BaseException:
      state.breaker.on_cancel(send)
      pool.metrics.record_request_end(url, failure="cancelled")
      pool.changed()
      raise
    finally:
      state.outstanding -= 1
    state.breaker.on_success(send)
    pool.changed()
    pool.metrics.record_request_end(
      url, latency_s=reply.latency_s, prompt_tokens=reply.prompt_tokens, completion_tokens=reply.completion_tokens
    )
    return reply


@dataclasses.dataclass
class Tries:
  """What one judgment's requests did so far: whether any reached an endpoint, and the last endpoint used (the
  one a hedge avoids)."""

  sent: bool = False
  last: EndpointState | None = None
