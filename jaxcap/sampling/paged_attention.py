"""Decode attention over a paged KV cache: one new token per row against the pages its table names, each row reading
its first `lengths[r]` cache positions (a prefix: prompts are left-aligned in their pages, `paged_cache`).

Three implementations with one interface, (q [R, N, H], k_pages / v_pages [K, P, Z, H], lengths int32 [R],
table int32 [R, n], scale) -> [R, N, H]:

- `paged_attention`, the jnp reference (any backend): gathers the n pages of each row's table and masks past its
  length, so a step reads the live bucket's n * Z positions per row;
- `blocked_paged_attention`, the CPU path: the same attention over blocks of pages with an online softmax
  (flash-decoding), stopping after the block that holds the longest row's last position. Each block's gathered
  keys and values stay in cache where the reference materialises the whole bucket and reads it back: on the
  `mid()` model's decode (64 rows, 36-page bucket, pages of 16) 4.6x faster per call, and a uniform-length
  rollout from 0.75x to about parity with the static sampler (docs/benchmarks-history.md). Sums in another order:
  equal to the reference within float rounding, not bitwise;
- the Pallas paged-attention kernels that ship with JAX, reading only the filled pages of each row (block by block:
  a block of pages past the row's length is never loaded): `jax.experimental.pallas.ops.tpu.paged_attention`
  (TPU; head dims a multiple of 128, the lane width; its K / V reads are bfloat16, so a float32 cache is rounded)
  and `jax.experimental.pallas.ops.gpu.paged_attention` (GPU, Triton; page_size a power of two >= 16, head dims a
  power of two). Neither applies the softmax scale: the queries are scaled first, in float32.

`choose` picks one per backend from `rollout.attention`: 'auto' is the platform's kernel on TPU (bfloat16 caches,
head dims it takes) and GPU (page sizes and head dims it takes), the blocked jnp path on CPU, the reference
elsewhere; 'reference' and 'pallas' force one. Tests run a kernel in Pallas interpret mode on CPU by setting
`INTERPRET` to its platform.

Every row needs lengths >= 1 (the kernels leave a row of length 0 unwritten). Shapes: R rows, N query heads, K
key/value heads (N / K query heads per group, Qwen2.5-VL's GQA), H head dim, P pages in the pool, Z tokens per
page, n pages per row's table.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxcap.choices import ROLLOUT_ATTENTION as ATTENTION_CHOICES

KERNEL_PLATFORMS = ("tpu", "gpu")
INTERPRET: str | None = None  # tests: "tpu" / "gpu" runs that platform's kernel in Pallas interpret mode (CPU)
TPU_BLOCK_TOKENS = 512  # the most cache positions one TPU kernel block loads (its VMEM buffers hold two)
GPU_BLOCK_PAGES = 8  # the most pages one GPU kernel block loads (the kernel's default)
CPU_BLOCK_TOKENS = 64  # the most cache positions one CPU block gathers (32-96 measured alike at 64 rows, 192 slower)
MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)  # `cached_attention`'s and the kernels' masked score


def paged_attention(
  q: jax.Array, k_pages: jax.Array, v_pages: jax.Array, lengths: jax.Array, table: jax.Array, scale: float
) -> jax.Array:
  """The reference. The math of `jaxcap.models.qwen25vl.cached_attention` (float32 scores and softmax, masked
  scores set to `MASK_VALUE`, probabilities cast to the values' dtype), so a row's output equals the static
  cache's wherever the two sum the same terms in the same order."""
  r, n_heads, h = q.shape
  kv_heads = k_pages.shape[0]
  keys = k_pages[:, table].reshape(kv_heads, r, -1, h).astype(q.dtype)  # [K, R, n * Z, H]
  values = v_pages[:, table].reshape(kv_heads, r, -1, h).astype(q.dtype)
  qg = q.reshape(r, kv_heads, n_heads // kv_heads, h).transpose(1, 0, 2, 3)  # [K, R, N / K, H]
  precision = jax.lax.DotAlgorithmPreset.BF16_BF16_F32 if q.dtype == jnp.bfloat16 else None
  scores = jnp.einsum("krgh,krsh->krgs", qg, keys, precision=precision, preferred_element_type=jnp.float32)
  scores = scores * jnp.float32(scale)
  visible = jnp.arange(keys.shape[2], dtype=jnp.int32)[None, :] < lengths[:, None]  # [R, n * Z]
  scores = jnp.where(visible[None, :, None, :], scores, MASK_VALUE)
  probs = jax.nn.softmax(scores, axis=-1).astype(values.dtype)
  return jnp.einsum("krgs,krsh->krgh", probs, values).transpose(1, 0, 2, 3).reshape(r, n_heads, h)


def blocked_paged_attention(
  q: jax.Array, k_pages: jax.Array, v_pages: jax.Array, lengths: jax.Array, table: jax.Array, scale: float
) -> jax.Array:
  """As `paged_attention`, over blocks of b pages (the largest divisor of n with b * Z <= `CPU_BLOCK_TOKENS`) with
  a running max, normaliser and weighted sum per row and head, float32; blocks past the longest row's length are
  not read. The first block always holds a visible position (lengths >= 1), so the running max is a real score
  from then on and masked scores contribute exp(MASK_VALUE - max) = 0."""
  r, n_heads, h = q.shape
  kv_heads, _, z, _ = k_pages.shape
  groups = n_heads // kv_heads
  b = largest_divisor(table.shape[1], CPU_BLOCK_TOKENS // z)
  precision = jax.lax.DotAlgorithmPreset.BF16_BF16_F32 if q.dtype == jnp.bfloat16 else None
  qg = q.reshape(r, kv_heads, groups, h).transpose(1, 0, 2, 3)  # [K, R, N / K, H]

  def block(i, carry):
    top, total, acc = carry
    pages = jax.lax.dynamic_slice_in_dim(table, i * b, b, axis=1)  # [R, b]
    keys = k_pages[:, pages].reshape(kv_heads, r, b * z, h).astype(q.dtype)
    values = v_pages[:, pages].reshape(kv_heads, r, b * z, h).astype(q.dtype)
    scores = jnp.einsum("krgh,krsh->krgs", qg, keys, precision=precision, preferred_element_type=jnp.float32)
    visible = i * b * z + jnp.arange(b * z, dtype=jnp.int32)[None, :] < lengths[:, None]  # [R, b * Z]
    scores = jnp.where(visible[None, :, None, :], scores * jnp.float32(scale), MASK_VALUE)
    new_top = jnp.maximum(top, scores.max(-1))
    probs = jnp.exp(scores - new_top[..., None])
    rescale = jnp.exp(top - new_top)
    weighted = jnp.einsum(
      "krgs,krsh->krgh", probs.astype(values.dtype), values, precision=precision, preferred_element_type=jnp.float32
    )
    return new_top, total * rescale + probs.sum(-1), acc * rescale[..., None] + weighted

  blocks = (jnp.max(lengths) + b * z - 1) // (b * z)
  start = (jnp.full((kv_heads, r, groups), MASK_VALUE), jnp.zeros((kv_heads, r, groups)), jnp.zeros(qg.shape))
  _, total, acc = jax.lax.fori_loop(0, blocks, block, start)
  out = acc / total[..., None]
  return out.transpose(1, 0, 2, 3).reshape(r, n_heads, h).astype(q.dtype)


def largest_divisor(n: int, at_most: int, *, powers_of_two: bool = False) -> int:
  """The largest d <= at_most dividing n (a power of two with `powers_of_two`); at least 1."""
  fits = [d for d in range(1, max(1, at_most) + 1) if n % d == 0 and (not powers_of_two or d & (d - 1) == 0)]
  return fits[-1]


def _tpu_kernel(q, k_pages, v_pages, lengths, table, *, interpret: bool):
  from jax.experimental.pallas import tpu as pltpu  # Pallas TPU: imported where it runs
  from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention as kernel

  z = k_pages.shape[2]
  block = largest_divisor(table.shape[1], TPU_BLOCK_TOKENS // z)
  run = lambda: kernel(q, k_pages, v_pages, lengths, table, mask_value=MASK_VALUE, pages_per_compute_block=block)
  if not interpret:
    return run()
  with pltpu.force_tpu_interpret_mode():
    return run()


def _gpu_kernel(q, k_pages, v_pages, lengths, table, *, interpret: bool):
  from jax.experimental.pallas.ops.gpu.paged_attention import paged_attention as kernel

  block = largest_divisor(table.shape[1], GPU_BLOCK_PAGES, powers_of_two=True)
  # one compute block per partition: the partitions (k_splits) run in parallel, those past a row's length skip
  splits = table.shape[1] // block
  return kernel(
    q, k_pages, v_pages, table, lengths, pages_per_compute_block=block, k_splits=splits, mask_value=MASK_VALUE,
    interpret=interpret,
  )  # fmt: skip


@dataclasses.dataclass(frozen=True)
class DecodeAttention:
  """The implementation a decode program calls (hashable: a static argument). kernel: 'reference', 'blocked',
  'tpu' or 'gpu'; interpret: run the kernel in Pallas interpret mode (tests, on CPU)."""

  kernel: str = "reference"
  interpret: bool = False

  def __call__(self, q, k_pages, v_pages, lengths, table, scale: float) -> jax.Array:
    """As `paged_attention` (lengths >= 1)."""
    if self.kernel == "reference":
      return paged_attention(q, k_pages, v_pages, lengths, table, scale)
    if self.kernel == "blocked":
      return blocked_paged_attention(q, k_pages, v_pages, lengths, table, scale)
    run = _tpu_kernel if self.kernel == "tpu" else _gpu_kernel
    scaled = (q.astype(jnp.float32) * scale).astype(q.dtype)  # the kernels apply no scale
    return run(scaled, k_pages, v_pages, lengths, table, interpret=self.interpret)


def choose(setting: str, platform: str, *, cache_dtype, page_size: int, head_dim: int) -> DecodeAttention:
  """The decode attention for `rollout.attention` = setting on `platform` ('cpu', 'tpu', 'gpu'; `INTERPRET`
  stands in for it) with a cache of `cache_dtype`, pages of `page_size` tokens and heads of `head_dim`."""
  if setting not in ATTENTION_CHOICES:
    raise ValueError(f"rollout.attention={setting!r}: use one of {', '.join(ATTENTION_CHOICES)}")
  kernel = INTERPRET or platform
  if setting == "reference" or kernel not in KERNEL_PLATFORMS:
    if setting == "pallas":
      raise ValueError(
        f"rollout.attention='pallas': JAX ships Pallas paged-attention kernels for TPU and GPU, not for {platform}; "
        "use rollout.attention='auto' (jnp attention there) or 'reference'"
      )
    return DecodeAttention("blocked" if setting == "auto" and kernel == "cpu" else "reference")
  refusal = None
  power_of_two = lambda x: x & (x - 1) == 0
  if kernel == "gpu" and not (page_size >= 16 and power_of_two(page_size)):
    refusal = f"on GPU the Triton kernel takes pages of a power of two >= 16 tokens, not rollout.page_size={page_size}"
  if kernel == "gpu" and not power_of_two(head_dim):
    refusal = f"on GPU the Triton kernel takes head dims that are a power of two, not the model's {head_dim}"
  if kernel == "tpu" and not INTERPRET and head_dim % 128:
    refusal = f"on TPU the Mosaic kernel takes head dims that are a multiple of 128, not the model's {head_dim}"
  if refusal:
    if setting == "pallas":
      raise ValueError(f"rollout.attention='pallas': {refusal}; use rollout.attention='auto' (the jnp reference)")
    return DecodeAttention()
  if setting == "auto" and kernel == "tpu" and jnp.dtype(cache_dtype) != jnp.bfloat16:
    return DecodeAttention()  # the TPU kernel reads K / V as bfloat16: a float32 cache keeps the reference
  return DecodeAttention(kernel, interpret=INTERPRET is not None)
