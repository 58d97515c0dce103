"""A paged KV cache: per layer, a pool of pages of `page_size` token slots, and per decode slot a page table.

Shapes (pool [K, P, Z, H] per layer): P pages in the pool, Z tokens per page, K key/value heads, H head dim, R decode
slots (rows), n pages a row reads (the live length bucket), N query heads.

Page 0 is the null page: never allocated, the target of every write a row must not make (an empty slot, a
finished sample still in its slot) and what unused page-table entries point at; its contents are never visible
(every position it backs is past its row's length).

A prompt is left-aligned in its pages: position 0 of its first page is its first real token, so a row's visible
cache is a prefix, positions [0, length), the layout JAX's Pallas paged-attention kernels read
(`jaxcap.sampling.paged_attention`). Its pages are written once, by its prefill, and its full pages are shared by
reference by its G samples: each sample's page table starts with the same page ids. A prompt of real % Z != 0
tokens ends in a partly filled page; each sample writes its own tokens after the prompt's end, so on admission it
gets its own copy of that page (`copy_pages`, copy-on-write) as its first page, and no page is ever written by
two samples.

Decoders with recurrent layers (Qwen3.5's linear layers: a fixed-size state per row, no keys or values) keep those
layers' states beside the pages: the pool holds its attention layers' pages only (`kv_layers`) and a small store of
prompt states (`PagePool.states`, one row per prompt in flight: `page_budget.state_rows`), written by the prompt's
prefill; a sample entering a decode slot gets a copy of its prompt's row in the slot's own state
(`paged_slots.Slots.states`), which its decode steps advance. A refilled slot's state is overwritten on admission.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxcap.sampling.paged_attention import DecodeAttention

NULL_PAGE = 0


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PagePool:
  """Keys and values of every attention layer: k[i], v[i] float [K, P, Z, H] (heads leading, the layout of JAX's
  Pallas paged-attention kernels: a row's gathered keys are then [K, n * Z, H] with the batch dims (K, R) leading, a
  plain batched matmul on XLA:CPU, no transposed copy of the cache); states: the prompts' recurrent states, one per
  recurrent layer, each leaf [S, ...] for S store rows (`model.empty_states`; () for a decoder of attention only)."""

  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]
  states: tuple = ()

  @classmethod
  def zeros(
    cls, layers: int, pages: int, page_size: int, kv_heads: int, head_dim: int, dtype, states: tuple = ()
  ) -> "PagePool":
    shape = (kv_heads, pages, page_size, head_dim)
    return cls(
      tuple(jnp.zeros(shape, dtype) for _ in range(layers)),
      tuple(jnp.zeros(shape, dtype) for _ in range(layers)),
      states,
    )

  @classmethod
  def for_model(cls, cfg, pages: int, page_size: int, state_rows: int = 0) -> "PagePool":
    """The pool of a model of config `cfg` (any family): pages for its attention layers (`kv_layers`) in the
    compute dtype, and `state_rows` rows of prompt states where it has recurrent layers."""
    t = cfg.text
    states = recurrent_zeros(cfg, state_rows)
    return cls.zeros(t.kv_layers, pages, page_size, t.num_key_value_heads, t.head_dim, cfg.dtype, states)

  @property
  def page_size(self) -> int:
    return self.k[0].shape[2]

  @property
  def pages(self) -> int:
    return self.k[0].shape[1]


def recurrent_zeros(cfg, rows: int) -> tuple:
  """Zeroed recurrent states of `rows` rows for a model of config `cfg` (its family's `empty_states`: () for a
  decoder of attention only)."""
  from jaxcap.models.families import family_of_config

  if not cfg.text.recurrent_bytes(cfg.dtype):  # attention only: no family to ask
    return ()
  return family_of_config(cfg).model_cls.empty_states(cfg, rows)


def grow_pool(pool: PagePool, pages: int) -> PagePool:
  """`pool` with `pages` pages (at least as many as it has): its pages kept at their ids, zeros after them (a
  stream of chunks whose next one needs more pages than the pool was sized for)."""
  more = pages - pool.pages
  grow = lambda p: jnp.pad(p, ((0, 0), (0, more), (0, 0), (0, 0))) if more > 0 else p
  return dataclasses.replace(pool, k=tuple(map(grow, pool.k)), v=tuple(map(grow, pool.v)))


def grow_states(pool: PagePool, rows: int) -> PagePool:
  """`pool` with `rows` rows of prompt states (at least as many as it has), its rows kept, zeros after them."""
  more = lambda a: rows - a.shape[0]
  grow = lambda a: jnp.pad(a, [(0, more(a))] + [(0, 0)] * (a.ndim - 1)) if more(a) > 0 else a
  return dataclasses.replace(pool, states=jax.tree.map(grow, pool.states))


def state_capacity(pool: PagePool) -> int:
  """Rows of the pool's store of prompt states (0 without recurrent layers)."""
  leaves = jax.tree.leaves(pool.states)
  return leaves[0].shape[0] if leaves else 0


def write_prompt_states(pool: PagePool, states: tuple, rows: jax.Array) -> PagePool:
  """Writes prefilled prompts' recurrent states (`states`: `model.cache_parts`', leaves [B, ...]) into the store's
  rows `rows` int32 [B] (a row past the store is dropped: a padded prompt)."""
  put = lambda store, x: store.at[rows].set(x.astype(store.dtype), mode="drop")
  return dataclasses.replace(pool, states=jax.tree.map(put, pool.states, states))


def write_prompt_pages(pool: PagePool, keys, values, page_ids: jax.Array, real: jax.Array) -> PagePool:
  """Writes prefilled prompts into the pool, left-aligned. keys[i] [B, K, H, T] / values[i] [B, K, T, H] (a
  `KVCache`'s layout: left-padded, T a multiple of Z); real int32 [B]: each prompt's tokens (its last `real`
  columns); page_ids int32 [B, T / Z]: where each page-sized block of the left-aligned prompt goes (its first
  ceil(real / Z) blocks; `NULL_PAGE` for the rest). The columns past a prompt's end in its last page hold its left
  padding's keys: never visible, overwritten by its samples' own tokens (on their copies)."""
  z = pool.page_size
  t = page_ids.shape[1] * z
  # column j of row b takes column j + (T - real[b]) of the left-padded cache, wrapping around
  source = (jnp.arange(t, dtype=jnp.int32)[None, :] + (t - real)[:, None]) % t  # [B, T]

  def pages(x):  # [B, K, T, H] -> [K, B, T / Z, Z, H], left-aligned
    x = jnp.take_along_axis(x, source[:, None, :, None], axis=2)
    b, kv, _, h = x.shape
    return x.transpose(1, 0, 2, 3).reshape(kv, b, t // z, z, h)

  k = tuple(p.at[:, page_ids].set(pages(x.transpose(0, 1, 3, 2)).astype(p.dtype)) for p, x in zip(pool.k, keys))
  v = tuple(p.at[:, page_ids].set(pages(x).astype(p.dtype)) for p, x in zip(pool.v, values))
  return dataclasses.replace(pool, k=k, v=v)


def copy_pages(pool: PagePool, source: jax.Array, target: jax.Array) -> PagePool:
  """Copies page source[a] to page target[a] in every layer (int32 [A]; a target >= P copies nothing): a
  sample's own copy of its prompt's partly filled last page."""
  copy = lambda p: p.at[:, target].set(p[:, jnp.clip(source, 0, p.shape[1] - 1)], mode="drop")
  return dataclasses.replace(pool, k=tuple(map(copy, pool.k)), v=tuple(map(copy, pool.v)))


@dataclasses.dataclass(frozen=True)
class PagedLayer:
  """One layer's view of the pool during a decode step, handed to `Attention` in place of a `KVCache` layer (it
  calls `attend`). write_page / write_offset int32 [R]: where each row's new key and value go; table int32 [R, n];
  lengths int32 [R]: the positions each row attends to, [0, lengths) (the new token's included); attention: the
  implementation (`paged_attention.choose`)."""

  k: jax.Array
  v: jax.Array
  table: jax.Array
  lengths: jax.Array
  write_page: jax.Array
  write_offset: jax.Array
  attention: DecodeAttention = DecodeAttention()

  def attend(self, q: jax.Array, k: jax.Array, v: jax.Array, scale: float) -> tuple[jax.Array, "PagedLayer"]:
    """q [R, 1, N, H], k / v [R, 1, K, H] of the new token -> (output [R, 1, N, H], the view with them written)."""
    kp = self.k.at[:, self.write_page, self.write_offset].set(k[:, 0].transpose(1, 0, 2).astype(self.k.dtype))
    vp = self.v.at[:, self.write_page, self.write_offset].set(v[:, 0].transpose(1, 0, 2).astype(self.v.dtype))
    out = self.attention(q[:, 0], kp, vp, self.lengths, self.table, scale)
    return out[:, None], dataclasses.replace(self, k=kp, v=vp)
