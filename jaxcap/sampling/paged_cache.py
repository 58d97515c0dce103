"""A paged KV cache: per layer, a pool of pages of `page_size` token slots, and per decode slot a page table.

Shapes (pool [K, P, Z, H] per layer): P pages in the pool, Z tokens per page, K key/value heads, H head dim, R decode slots (rows), n pages a row
reads (the live length bucket), N query heads.

Page 0 is the null page: never allocated, the target of every write a row must not make (an empty slot, a
finished sample still in its slot) and what unused page-table entries point at; its contents are never visible
(every position it backs is masked).

A prompt's pages are written once, by its prefill, and shared by reference: each of its G samples' page tables
starts with the same page ids, followed by pages of its own. A prompt is right-aligned in its pages (its left
padding, fewer than Z tokens, at the start of the first page), so every sample's first generated token starts a
page of its own and no page is ever written by two samples.

`paged_attention` is the reference implementation (plain jnp, any backend): it gathers the n pages of each row's
table, so a decode step reads n * Z slots per row, the live bucket, not the cache's capacity.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

NULL_PAGE = 0


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PagePool:
  """Keys and values of every layer: k[i], v[i] float [K, P, Z, H] (heads leading, the layout of JAX's Pallas
  paged-attention kernels: a row's gathered keys are then [K, n * Z, H] with the batch dims (K, R) leading, a plain
  batched matmul on XLA:CPU, no transposed copy of the cache)."""

  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]

  @classmethod
  def zeros(cls, layers: int, pages: int, page_size: int, kv_heads: int, head_dim: int, dtype) -> "PagePool":
    shape = (kv_heads, pages, page_size, head_dim)
    return cls(
      tuple(jnp.zeros(shape, dtype) for _ in range(layers)), tuple(jnp.zeros(shape, dtype) for _ in range(layers))
    )

  @property
  def page_size(self) -> int:
    return self.k[0].shape[2]

  @property
  def pages(self) -> int:
    return self.k[0].shape[1]


def write_prompt_pages(pool: PagePool, keys, values, page_ids: jax.Array) -> PagePool:
  """Writes prefilled prompts into the pool. keys[i] [B, K, H, T] / values[i] [B, K, T, H] (a `KVCache`'s layout,
  T a multiple of Z); page_ids int32 [B, T / Z]: where each page-sized block of columns goes (`NULL_PAGE` for
  blocks holding only left padding)."""
  z = pool.page_size

  def pages(x):  # [K, B, T, H] -> [K, B, T / Z, Z, H]
    kv, b, t, h = x.shape
    return x.reshape(kv, b, t // z, z, h)

  k = tuple(p.at[:, page_ids].set(pages(x.transpose(1, 0, 3, 2)).astype(p.dtype)) for p, x in zip(pool.k, keys))
  v = tuple(p.at[:, page_ids].set(pages(x.transpose(1, 0, 2, 3)).astype(p.dtype)) for p, x in zip(pool.v, values))
  return PagePool(k, v)


def paged_attention(
  q: jax.Array, k_pages: jax.Array, v_pages: jax.Array, table: jax.Array, visible: jax.Array, scale: float
) -> jax.Array:
  """GQA attention of one new token per row, q [R, N, H], over the pages table int32 [R, n] names in the pool's
  keys / values [K, P, Z, H]; visible bool [R, n * Z] marks the positions each row attends to. -> [R, N, H].

  The math of `jaxcap.models.qwen25vl.cached_attention` (float32 scores and softmax, masked scores set to
  -0.7 x the float32 max, probabilities cast to the values' dtype), so a row's output equals the static cache's
  wherever the two sum the same terms in the same order."""
  r, n_heads, h = q.shape
  kv_heads = k_pages.shape[0]
  keys = k_pages[:, table].reshape(kv_heads, r, -1, h).astype(q.dtype)  # [K, R, n * Z, H]
  values = v_pages[:, table].reshape(kv_heads, r, -1, h).astype(q.dtype)
  qg = q.reshape(r, kv_heads, n_heads // kv_heads, h).transpose(1, 0, 2, 3)  # [K, R, N / K, H]
  precision = jax.lax.DotAlgorithmPreset.BF16_BF16_F32 if q.dtype == jnp.bfloat16 else None
  scores = jnp.einsum("krgh,krsh->krgs", qg, keys, precision=precision, preferred_element_type=jnp.float32)
  scores = scores * jnp.float32(scale)
  scores = jnp.where(visible[None, :, None, :], scores, -0.7 * float(jnp.finfo(jnp.float32).max))
  probs = jax.nn.softmax(scores, axis=-1).astype(values.dtype)
  return jnp.einsum("krgs,krsh->krgh", probs, values).transpose(1, 0, 2, 3).reshape(r, n_heads, h)


@dataclasses.dataclass(frozen=True)
class PagedLayer:
  """One layer's view of the pool during a decode step, handed to `Attention` in place of a `KVCache` layer (it
  calls `attend`). write_page / write_offset int32 [R]: where each row's new key and value go; table int32 [R, n];
  visible bool [R, n * Z] (the new token's position included)."""

  k: jax.Array
  v: jax.Array
  table: jax.Array
  visible: jax.Array
  write_page: jax.Array
  write_offset: jax.Array

  def attend(self, q: jax.Array, k: jax.Array, v: jax.Array, scale: float) -> tuple[jax.Array, "PagedLayer"]:
    """q [R, 1, N, H], k / v [R, 1, K, H] of the new token -> (output [R, 1, N, H], the view with them written)."""
    kp = self.k.at[:, self.write_page, self.write_offset].set(k[:, 0].transpose(1, 0, 2).astype(self.k.dtype))
    vp = self.v.at[:, self.write_page, self.write_offset].set(v[:, 0].transpose(1, 0, 2).astype(self.v.dtype))
    out = paged_attention(q[:, 0], kp, vp, self.table, self.visible, scale)
    return out[:, None], dataclasses.replace(self, k=kp, v=vp)
