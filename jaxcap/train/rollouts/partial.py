"""Partial rollouts (`rl.partial_rollouts`, with rl.max_staleness = k >= 2): a window's rounds go through one paged
engine as one stream of chunks, so the slots a round's last, longest samples leave free are filled by the next
round's samples instead of idling, and those samples are not discarded when the weights change: they continue
under the next version (APRIL; verl's and slime's partial rollouts).

    rounds = PartialRounds(source, start=w, end=e, max_staleness=k, key=key, mesh=mesh, thread=True)
    rounds.offer(r, batch); rounds.publish(v, params)      # the loop, as the schedule queues rounds
    generated, versions = rounds.take(r)                   # round r, finished; versions int32 [B*G, N]

The version rule. Chunk c is round w + c. Round r enters the engine once round r - 2 has finished (at most two
rounds decode at once), and while round r is the oldest unfinished one every program runs with version
max(w, r - k + 1). So each token of round r is sampled by version r - k or r - k + 1 (at most k updates stale),
recorded per token (`chunk_feed.TokenVersions`) beside its log-prob, which is the behaviour policy's exactly (the
rollout correction's input). The engine waits for a round's batch or a version the loop has not handed over yet,
never runs ahead without it: where each version starts reads only the engine's own progress, so the run is the
same whatever the timing, and the window (a checkpoint's) ends with every round finished, nothing carried over.
With rl.stream_judging each round's groups go to the judge as they finish, else each round when it finishes.
One engine per device of the rollouts' mesh (`jaxcap.sampling.mesh_stream` over several), on one process.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Any

import jax
import numpy as np

from jaxcap.sampling.mesh_shards import on
from jaxcap.sampling.rollouts import Rollouts
from jaxcap.sampling.scheduler import run_to_end
from jaxcap.train.rollouts.source import Generated


class RoundFeed:
  """Rounds [start, start + count) of `block` prompts each as the engine's stream (`jaxcap.sampling.chunk_feed`):
  `offer` hands it a round's host batch, `publish` a version; the engine waits for them."""

  ahead = 1  # a round enters once every round but the one before it has finished

  def __init__(self, start: int, count: int, block: int, max_staleness: int, on_round):
    self.start, self.max_staleness, self.on_round = start, max_staleness, on_round
    self.blocks = [block] * count
    self.ring = 2 * block
    self._batches: dict[int, Any] = {}
    self._versions: dict[int, Any] = {}
    self._cond = threading.Condition()
    self.closed = False

  def version(self, c: int) -> int:
    """The version programs run with while chunk `c` is the oldest unfinished one."""
    return max(self.start, self.start + c - self.max_staleness + 1)

  def offer(self, c: int, batch) -> None:
    with self._cond:
      self._batches[c] = batch
      self._cond.notify_all()

  def publish(self, version: int, params) -> None:
    with self._cond:
      self._versions[version] = params
      for v in [v for v in self._versions if v < version - 1]:  # no chunk can need them again
        del self._versions[v]
      self._cond.notify_all()

  def close(self) -> None:
    with self._cond:
      self.closed = True
      self._cond.notify_all()

  def _wait(self, table: dict, key: int, what: str):
    with self._cond:
      while key not in table:
        if self.closed:
          raise RuntimeError(f"partial rollouts stopped waiting for {what} {key}")
        self._cond.wait(timeout=1.0)
      return table[key]

  def available(self) -> list:
    return [self._batches[0].prompts] if 0 in self._batches else []

  def chunk(self, c: int):
    return self._wait(self._batches, c, "round").prompts

  def weights(self, oldest: int) -> tuple[Any, int]:
    v = self.version(oldest)
    return self._wait(self._versions, v, "version"), v

  def finished(self, c: int, arrays, versions: np.ndarray) -> None:
    self.on_round(c, self._batches.pop(c), arrays, versions)


class PartialRounds:
  """A window [start, end) of rounds through one engine stream (see the module docstring): on a thread of its own
  (`thread`, the rollout devices) or driven by the loop as it takes each round (colocated). `mesh`: the rollouts'
  one-device mesh. Each round goes to the judge as soon as it finishes."""

  def __init__(self, source, start: int, end: int, max_staleness: int, key, mesh, block: int, thread: bool):
    self.source, self.start = source, start
    self.results = {r: Future() for r in range(start, end)}
    self.feed = RoundFeed(start, end - start, block, max_staleness, self._finished)
    self._mesh = mesh
    if jax.process_count() != 1:
      raise ValueError(
        f"rl.partial_rollouts runs on one process (here {jax.process_count()}); use partial_rollouts=False"
      )
    # the window's draws, keyed as one call's: (key, prompt, sample, token)
    key = jax.device_put(key, mesh.devices.flat[0])
    # streaming judging: each round's groups go to the judge as the engine finishes them (its stream opened when
    # the round is offered: streams are judged one at a time, in round order)
    self.streams: dict[int, Any] = {}
    self._block = block
    stream = source.stream_judging and source.sampler.streams_groups
    on_group = self._hand_to_judge if stream else None
    with self._on():  # one engine per device of the rollouts' mesh (`mesh_stream`), or the one device's
      self._run = source.sampler.rounds(self.feed, key, num_samples=source.num_samples, on_group=on_group)
    self._t0 = time.perf_counter()
    self._thread = None
    if thread:
      self._thread = threading.Thread(target=self._drive_all, name="partial-rollouts", daemon=True)
      self._thread.start()

  def offer(self, r: int, batch) -> None:
    if self.source.stream_judging and self.source.sampler.streams_groups:
      self.streams[r] = self.source.reward.stream(batch.records, group_size=self.source.num_samples, step=r)
    self.feed.offer(r - self.start, batch)

  def publish(self, version: int, params) -> None:
    self.feed.publish(version, params)

  def take(self, r: int) -> tuple[Generated, np.ndarray]:
    """Round r, finished and handed to the judge: (Generated, each token's version int32 [B*G, N])."""
    future = self.results[r]
    while self._thread is None and not future.done():  # colocated: the loop drives the engine to the round's end
      with self._on():
        try:
          next(self._run)
        except StopIteration:
          break
    return future.result()

  def close(self) -> None:
    self.feed.close()
    for stream in self.streams.values():  # rounds never finished: their judging threads would wait for them
      stream.cancel()

  def _on(self):
    """The engine's context: its one device, or the rollouts' mesh (each device's engine then runs on its own)."""
    return on(self._mesh.devices.flat[0]) if self._mesh.size == 1 else jax.set_mesh(self._mesh)

  def _hand_to_judge(self, prompt: int, tokens: np.ndarray, lengths: np.ndarray) -> None:
    """The engine's `on_group`: prompt `prompt` of the window (its round's prompt prompt % block) is done."""
    c, b = divmod(prompt, self._block)
    decode = self.source.sampler.tokenizer.batch_decode
    self.streams[self.start + c].add(b, decode([t[:n] for t, n in zip(tokens, lengths)], skip_special_tokens=True))

  def _drive_all(self) -> None:
    try:
      with self._on():
        run_to_end(self._run)
    except BaseException as e:  # every round still waited for gets the error
      self.close()
      for future in self.results.values():
        if not future.done():
          future.set_exception(e)

  def _finished(self, c: int, batch, arrays, versions: np.ndarray) -> None:
    r, source = self.start + c, self.source
    prompts = batch.prompts
    rollouts = Rollouts(
      arrays, rows=prompts.rows, num_samples=source.num_samples, first_row=0, tokenizer=source.sampler.tokenizer,
      multi=False,
    )  # fmt: skip
    now = time.perf_counter()
    gen = Generated(batch, rollouts, None, now - self._t0)
    self._t0 = now
    stream = self.streams.pop(r, None)
    if stream is not None and stream.added != prompts.rows:
      raise RuntimeError(f"the engine handed over {stream.added} of round {r}'s {prompts.rows} groups")
    # in round order: rounds finish in order
    gen.judging = stream.future if stream is not None else source.submit(gen, r)
    self.results[r].set_result((gen, versions))


def token_staleness(versions: np.ndarray, lengths: np.ndarray, step: int) -> tuple[float, float]:
  """(mean, max) over a round's emitted tokens of the updates between their version and step `step`'s."""
  emitted = np.arange(versions.shape[1])[None, :] < np.asarray(lengths)[:, None]
  stale = step - versions[emitted]
  return (float(stale.mean()), float(stale.max())) if stale.size else (0.0, 0.0)
