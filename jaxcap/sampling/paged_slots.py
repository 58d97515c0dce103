"""The paged engine's decode slots and what a rollout returns: `Outputs` (in output-row order), `Slots` (the R
slots' device state), and the programs that admit samples into slots (copying their prompt's partly filled last
page, `paged_cache.copy_pages`) and compact slots into a smaller row bucket.
The host scheduler (`jaxcap.sampling.scheduler`) decides what each does; the decode programs are
`jaxcap.sampling.paged_decode`.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxcap.sampling.distribution import is_stop
from jaxcap.sampling.paged_cache import PagePool, copy_pages

# How many times each of the engine's programs has been traced (= compiled) in this process.
TRACE_COUNTS: collections.Counter = collections.Counter()


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Outputs:
  """What the rollout returns, in output-row order: tokens int32 [O, N] (pad after the stop), sample_logprobs /
  policy_logprobs float32 [O, N] (0 after it), lengths int32 [O] (tokens emitted, the stop token included)."""

  tokens: jax.Array
  sample_logprobs: jax.Array
  policy_logprobs: jax.Array
  lengths: jax.Array

  @classmethod
  def empty(cls, rows: int, max_new_tokens: int, pad_id: int) -> "Outputs":
    zeros = lambda: jnp.zeros((rows, max_new_tokens), jnp.float32)  # separate buffers: all are donated
    return cls(jnp.full((rows, max_new_tokens), pad_id, jnp.int32), zeros(), zeros(), jnp.zeros((rows,), jnp.int32))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Slots:
  """R decode slots. row int32 [R]: the output row of the slot's sample (O when empty); key_row int32 [R]: the row
    its draws are keyed by (prompt * G + sample, the prompt numbered in the call: `paged_decode.sample_key`); done bool [R] (True when
    empty); token int32 [R]: its last emitted token (the next step's input); emitted int32 [R]; limit int32 [R]: how
    many tokens it may emit; length int32 [R]: positions in its pages, all visible (the next token is written at
    `length`); position int32 [R]: the mRoPE position of its last token; states: its recurrent layers' states (leaves
  [R, ...], `model.empty_states`; () for a decoder of attention only), its prompt's copied in on admission."""

  row: jax.Array
  key_row: jax.Array
  done: jax.Array
  token: jax.Array
  emitted: jax.Array
  limit: jax.Array
  length: jax.Array
  position: jax.Array
  states: tuple = ()

  @classmethod
  def empty(cls, slots: int, out_rows: int, states: tuple = ()) -> "Slots":
    """`slots` empty slots; `states`: their zeroed recurrent states (`paged_cache.recurrent_zeros(cfg, slots)`)."""
    zeros = [jnp.zeros((slots,), jnp.int32) for _ in range(5)]
    return cls(
      jnp.full((slots,), out_rows, jnp.int32),
      jnp.zeros((slots,), jnp.int32),
      jnp.ones((slots,), bool),
      *zeros,
      states,
    )


def admit(
  slots: Slots,
  out: Outputs,
  pool: PagePool,
  index,
  row,
  key_row,
  limit,
  length,
  position,
  copy_from,
  copy_to,
  state_from=None,
  *,
  stop_ids,
):
  """Places samples in slots: index int32 [A] (R = none), row / key_row / limit / length / position int32 [A] per
  `Slots`.
  Each starts from its token 0, already sampled by the prefill. copy_from / copy_to int32 [A]: the page each copies
  into its first own page (copy_to = P: none). state_from int32 [A]: the row of the pool's prompt states each
  starts from (its prompt's; unused without recurrent layers): copied over the slot's states, whatever a previous
  sample left there. -> (slots, pool)."""
  TRACE_COUNTS["admit"] += 1
  token = out.tokens[jnp.minimum(row, out.tokens.shape[0] - 1), 0]
  done = is_stop(token, stop_ids) | (limit <= 1)
  set_ = lambda a, x: a.at[index].set(x.astype(a.dtype), mode="drop")
  states = slots.states
  if states:
    take = lambda store: store[jnp.clip(state_from, 0, store.shape[0] - 1)]
    states = jax.tree.map(lambda a, store: set_(a, take(store)), states, pool.states)
  return Slots(
    set_(slots.row, row),
    set_(slots.key_row, key_row),
    set_(slots.done, done),
    set_(slots.token, token),
    set_(slots.emitted, jnp.ones_like(row)),
    set_(slots.limit, limit),
    set_(slots.length, length),
    set_(slots.position, position),
    states,
  ), copy_pages(pool, copy_from, copy_to)


def compact(slots: Slots, index, *, out_rows):
  """The slots `index` int32 [R'] names (-1 = empty), as a bucket of R' slots."""
  TRACE_COUNTS["compact"] += 1
  keep = index >= 0
  taken = jax.tree.map(lambda a: a[jnp.maximum(index, 0)], slots)
  return dataclasses.replace(taken, row=jnp.where(keep, taken.row, out_rows), done=jnp.where(keep, taken.done, True))


def clear_rows(out: Outputs, first, *, rows: int, pad_id: int) -> Outputs:
  """`out` with rows [first, first + rows) (int32 scalar first) emptied: pad tokens, zero log-probs and lengths
  (a stream's rows, reused by a later chunk once handed back)."""
  TRACE_COUNTS["clear_rows"] += 1
  n = out.tokens.shape[1]
  put = lambda a, x: jax.lax.dynamic_update_slice(a, x, (first,) + (0,) * (a.ndim - 1))
  zeros = jnp.zeros((rows, n), jnp.float32)
  return Outputs(
    put(out.tokens, jnp.full((rows, n), pad_id, jnp.int32)),
    put(out.sample_logprobs, zeros),
    put(out.policy_logprobs, zeros),
    put(out.lengths, jnp.zeros((rows,), jnp.int32)),
  )


clear_rows_jit = jax.jit(clear_rows, static_argnames=("rows", "pad_id"), donate_argnames=("out",))
admit_jit = jax.jit(admit, static_argnames=("stop_ids",), donate_argnames=("slots", "pool"))
compact_jit = jax.jit(compact, static_argnames=("out_rows",))


def hand_over(
  on_group: Callable, out: Outputs, prompts: list[int], g: int, groups: np.ndarray, out_row=lambda r: r
) -> None:
  """`on_group(groups[prompt], tokens [G, N], lengths [G])` for each finished prompt, from one copy of its rows
  (`out_row`: an output row's place in `out`)."""
  rows = np.asarray([out_row(p * g + s) for p in prompts for s in range(g)], np.int32)
  tokens, lengths = jax.device_get((out.tokens[rows], out.lengths[rows]))
  for k, prompt in enumerate(prompts):
    on_group(int(groups[prompt]), tokens[k * g : (k + 1) * g], lengths[k * g : (k + 1) * g])
