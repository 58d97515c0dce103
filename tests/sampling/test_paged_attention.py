"""The paged engine's decode attention (jaxcap.sampling.paged_attention): JAX's Pallas paged-attention kernels, TPU
and GPU, run in Pallas interpret mode on CPU, equal the jnp reference on random pools, page tables and lengths (GQA,
pages shared by rows); the choice per backend; prompts left-aligned in their pages and each sample's copy of a
partly filled last page (jaxcap.sampling.paged_cache); and the engine's greedy rollouts through a kernel equal to
the static sampler's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcap.sampling import Sampler, SamplingConfig, paged_attention
from jaxcap.sampling.engine import EngineConfig, PagedSampler
from jaxcap.sampling.paged_attention import DecodeAttention, choose
from jaxcap.sampling.paged_cache import NULL_PAGE, PagePool, copy_pages, write_prompt_pages
from abstract_gpu import abstract_gpu
from sampling_fixtures import PADDED_BATCH, tiny_checkpoint

H, Z, PAGES = 16, 4, 24  # head dim, tokens per page, pages in the pool


def _case(n_heads, kv_heads, dtype, seed=0):
  """Rows 0 and 1 share their first two pages (a prompt's, read by two samples) and then read pages of their own;
  lengths: a partly filled last page, one position, every position of the table, a page boundary."""
  rng = np.random.default_rng(seed)
  # values a bfloat16 holds exactly: the TPU kernel reads K / V as bfloat16, so the two sum the same numbers
  normal = lambda *shape: np.asarray(jnp.asarray(rng.normal(size=shape), jnp.bfloat16).astype(jnp.float32))
  k_pages, v_pages = normal(kv_heads, PAGES, Z, H), normal(kv_heads, PAGES, Z, H)
  own = rng.permutation(np.arange(3, PAGES))
  table = np.stack([[1, 2, *own[0:4]], [1, 2, *own[4:8]], own[8:14], own[14:20]]).astype(np.int32)  # [4, 6]
  lengths = np.asarray([11, 1, 6 * Z, 2 * Z], np.int32)
  q = normal(len(table), n_heads, H)
  return tuple(jnp.asarray(x, dtype) for x in (q, k_pages, v_pages)) + (jnp.asarray(lengths), jnp.asarray(table))


def _contiguous(q, k_pages, v_pages, lengths, table, scale):
  """Attention written out per row and head in float64 over the positions the table's pages hold in order."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k_pages, v_pages))
  groups = q.shape[1] // k.shape[0]
  out = np.zeros(q.shape)
  for r, (pages, length) in enumerate(zip(np.asarray(table), np.asarray(lengths))):
    for n in range(q.shape[1]):
      keys = k[n // groups, pages].reshape(-1, H)[:length]
      values = v[n // groups, pages].reshape(-1, H)[:length]
      p = np.exp(keys @ q[r, n] * scale - (keys @ q[r, n] * scale).max())
      out[r, n] = p @ values / p.sum()
  return out


@pytest.mark.parametrize("n_heads,kv_heads", [(8, 2), (14, 2), (16, 2)], ids=["groups4", "groups7", "groups8"])
def test_reference_equals_attention_over_the_rows_pages(n_heads, kv_heads):
  args = _case(n_heads, kv_heads, jnp.float32)
  got = paged_attention.paged_attention(*args, 0.3)
  np.testing.assert_allclose(np.asarray(got), _contiguous(*args, 0.3), atol=2e-6, rtol=0)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_blocked_attention_equals_the_reference_and_reads_no_block_past_the_longest_row(monkeypatch, dtype):
  """Blocks of 2 pages (3 blocks over the 6-page tables): equal to the reference on the shared-page case; with
  every row within the first two blocks, the third block's pages hold NaN and the result is still finite (the
  reference, which reads the whole table, is not)."""
  monkeypatch.setattr(paged_attention, "CPU_BLOCK_TOKENS", 2 * Z)
  q, k_pages, v_pages, lengths, table = _case(8, 2, dtype, seed=2)
  blocked = jax.jit(DecodeAttention("blocked"), static_argnums=5)
  want = np.asarray(paged_attention.paged_attention(q, k_pages, v_pages, lengths, table, 0.3), np.float32)
  got = blocked(q, k_pages, v_pages, lengths, table, 0.3)
  assert got.dtype == dtype
  tol = 2e-6 if dtype == jnp.float32 else 2e-2  # bfloat16: the reference rounds probabilities to bfloat16
  np.testing.assert_allclose(np.asarray(got, np.float32), want, atol=tol, rtol=tol)
  short = jnp.minimum(lengths, 4 * Z)
  poisoned = [p.at[:, table[:, 4:]].set(jnp.nan) for p in (k_pages, v_pages)]
  clean = paged_attention.paged_attention(q, k_pages, v_pages, short, table, 0.3)
  got = blocked(q, *poisoned, short, table, 0.3)
  np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(clean, np.float32), atol=tol, rtol=tol)
  assert np.isnan(np.asarray(paged_attention.paged_attention(q, *poisoned, short, table, 0.3), np.float32)).any()


# 7 query heads a key/value head: Qwen2.5-VL-7B (28 / 4); 8: the 3B (16 / 2), the TPU kernel's other layout of q
@pytest.mark.parametrize("n_heads,kv_heads", [(8, 2), (14, 2), (16, 2)], ids=["groups4", "groups7", "groups8"])
@pytest.mark.parametrize("kernel", ["tpu", "gpu"])
def test_kernels_equal_the_reference(kernel, n_heads, kv_heads):
  args = _case(n_heads, kv_heads, jnp.float32)
  want = paged_attention.paged_attention(*args, 0.3)
  got = jax.jit(DecodeAttention(kernel, interpret=True), static_argnums=5)(*args, 0.3)
  assert got.shape == want.shape and got.dtype == want.dtype
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-6, rtol=2e-6)


def test_tpu_kernel_in_bfloat16():
  """The TPU kernel's dtype on TPU: within bfloat16 rounding of the reference (which casts probabilities to
  bfloat16 before the values, the kernel keeps them in float32)."""
  args = _case(16, 2, jnp.bfloat16, seed=1)
  want = np.asarray(paged_attention.paged_attention(*args, 0.3), np.float32)
  got = jax.jit(DecodeAttention("tpu", interpret=True), static_argnums=5)(*args, 0.3)
  assert got.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(got, np.float32), want, atol=2e-2, rtol=2e-2)


def test_choice_per_backend(monkeypatch):
  f32, bf16 = jnp.float32, jnp.bfloat16
  pick = lambda setting, platform, dtype=bf16, z=16, h=128: choose(
    setting, platform, cache_dtype=dtype, page_size=z, head_dim=h
  )
  assert pick("auto", "cpu") == DecodeAttention("blocked")
  assert pick("reference", "cpu") == DecodeAttention("reference")
  assert pick("auto", "tpu") == DecodeAttention("tpu")
  assert pick("auto", "tpu", f32) == DecodeAttention("reference")  # the kernel reads K / V as bfloat16
  assert pick("pallas", "tpu", f32) == DecodeAttention("tpu")
  assert pick("auto", "tpu", h=64) == DecodeAttention("reference")
  assert pick("auto", "gpu", f32) == DecodeAttention("gpu")
  assert pick("auto", "gpu", z=12) == DecodeAttention("reference")
  assert pick("auto", "gpu", h=80) == DecodeAttention("reference")
  assert pick("reference", "tpu") == DecodeAttention("reference")
  with pytest.raises(ValueError, match="not for cpu; use rollout.attention='auto'"):
    pick("pallas", "cpu")
  with pytest.raises(ValueError, match="power of two >= 16 tokens, not rollout.page_size=8; use"):
    pick("pallas", "gpu", z=8)
  with pytest.raises(ValueError, match="head dims that are a power of two, not the model's 80"):
    pick("pallas", "gpu", h=80)
  with pytest.raises(ValueError, match="multiple of 128, not the model's 64; use rollout.attention='auto'"):
    pick("pallas", "tpu", h=64)
  with pytest.raises(ValueError, match="rollout.attention='flash': use one of auto, reference, pallas"):
    pick("flash", "cpu")
  with pytest.raises(ValueError, match="rollout.attention='flash'; use one of"):
    EngineConfig(attention="flash")
  monkeypatch.setattr(paged_attention, "INTERPRET", "tpu")  # tests: any head dim, in interpret mode
  assert pick("pallas", "cpu", f32, z=4, h=16) == DecodeAttention("tpu", interpret=True)


def test_prompts_are_left_aligned_and_a_partly_filled_page_is_copied():
  """Left-padded prefill caches (prompts of 5 and 8 tokens in 8 columns, pages of 4): each prompt's tokens at
  positions 0 .. real - 1 of its pages; the copy of the 5-token prompt's second page holds its fifth token."""
  kv, h, t = 2, 3, 8
  real = np.asarray([5, 8], np.int32)
  k = np.zeros((2, kv, h, t), np.float32)  # [B, K, H, T]: column c of row b holds c - pad + 1, 0 on padding
  for b, n in enumerate(real):
    k[b, :, :, t - n :] = np.arange(1, n + 1)
  v = k.transpose(0, 1, 3, 2).copy()  # [B, K, T, H]
  pool = PagePool.zeros(1, 8, 4, kv, h, jnp.float32)
  page_ids = np.asarray([[3, 5], [6, 2]], np.int32)
  pool = write_prompt_pages(pool, [jnp.asarray(k)], [jnp.asarray(v)], jnp.asarray(page_ids), jnp.asarray(real))
  pool = copy_pages(pool, jnp.asarray([5, 0], jnp.int32), jnp.asarray([7, 8], jnp.int32))  # 8 >= P: no copy
  for layer in (pool.k[0], pool.v[0]):
    pages = np.asarray(layer)[0, :, :, 0]  # [P, Z], head 0, dim 0
    np.testing.assert_array_equal(pages[[3, 5]].reshape(-1)[:5], np.arange(1, 6))
    np.testing.assert_array_equal(pages[[6, 2]].reshape(-1), np.arange(1, 9))
    np.testing.assert_array_equal(pages[7][:1], [5])  # the copy of page 5 (its first position: token 5)
    np.testing.assert_array_equal(pages[[1, 4]], 0)  # untouched
  assert NULL_PAGE == 0


@pytest.mark.parametrize("width", [1, 6, 12])
def test_the_gpu_kernel_lowers_for_cuda(width):
  """No GPU needed: the Triton lowering (its power-of-two block shapes) of Qwen2.5-VL-3B's decode attention at
  page buckets of 1, 6 and 12 pages of 16 tokens."""
  rows, pages = 8, 64
  shape = lambda *s, dtype=jnp.bfloat16: jax.ShapeDtypeStruct(s, dtype)
  pool = shape(2, pages, 16, 128)
  args = (shape(rows, 16, 128), pool, pool, shape(rows, dtype=jnp.int32), shape(rows, width, dtype=jnp.int32))
  run = jax.jit(lambda *a: DecodeAttention("gpu")(*a, 128**-0.5))
  with abstract_gpu():  # jax 0.11 lowers Triton for a GPU it is told of (tests/abstract_gpu.py)
    text = run.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  assert text.count("__gpu$xla.gpu.triton") == 1


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  return tiny_checkpoint(tmp_path_factory.mktemp("paged_kernel"), 0)


# TPU interpret mode simulates the chip's DMAs and semaphores: ~20 s here, the GPU kernel's interpreter ~2 s
@pytest.mark.parametrize("kernel", [pytest.param("tpu", marks=pytest.mark.slow), "gpu"])
def test_greedy_rollouts_through_a_kernel_equal_the_static_sampler(models, monkeypatch, kernel):
  """The engine's decode segments through a Pallas kernel (interpret mode): prompts with and without a partly
  filled last page (pages of 4 tokens), samples refilled mid-rollout, the same greedy tokens as the static sampler."""
  _, model, proc = models
  monkeypatch.setattr(paged_attention, "INTERPRET", kernel)
  calls = []
  monkeypatch.setattr(
    paged_attention, f"_{kernel}_kernel", _counting(getattr(paged_attention, f"_{kernel}_kernel"), calls)
  )
  sampling = SamplingConfig(temperature=0, max_new_tokens=6)
  static = Sampler(model, processor=proc, sampling=sampling)(PADDED_BATCH, jax.random.key(0), num_samples=2)
  page_size = 4 if kernel == "tpu" else 16  # the GPU kernel's smallest pages
  engine = EngineConfig(slots=3, page_size=page_size, segment_steps=3, attention="pallas")
  got = PagedSampler(model, processor=proc, sampling=sampling, engine=engine)(
    PADDED_BATCH, jax.random.key(0), num_samples=2
  )
  assert calls  # traced through the kernel
  np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(static.tokens))
  np.testing.assert_array_equal(np.asarray(got.lengths), np.asarray(static.lengths))


def _counting(fn, calls):
  def run(*args, **kw):
    calls.append(1)
    return fn(*args, **kw)

  return run


def test_the_segment_compiles_with_the_tpu_kernel_for_a_tpu_topology(monkeypatch):
  """Where the TPU compiler is importable (libtpu, no chip needed): `jaxcap.plan` of the paged engine on a TPU
  target lowers the decode segment with the Pallas kernel (a Mosaic custom call) for a bfloat16 model of
  head dim 128, and without it for rollout.attention='reference'."""
  pytest.importorskip("libtpu")
  import dataclasses

  from jaxcap.models.qwen25vl_presets import tiny
  from jaxcap.plan import engine as plan_engine
  from jaxcap.plan import format_plan, plan
  from jaxcap.plan.topology import topology_devices
  from jaxcap.config_files import base_config

  c = base_config()
  c.model.update(dict(dtype="bfloat16", param_dtype="float32", remat="full"))
  c.rl.update(dict(batch_size=2, num_samples=2, micro_batches=1))
  c.sampling.max_new_tokens = 40
  c.data.image_size = 56
  c.mesh.shape.fsdp = 1
  c.rollout.update(dict(engine="paged", slots=4, page_size=16))
  base = tiny(dtype=jnp.bfloat16, remat="full")
  text = dataclasses.replace(
    base.text, hidden_size=512, num_attention_heads=4, num_key_value_heads=2, mrope_section=(16, 24, 24)
  )
  cfg = dataclasses.replace(base, text=text)  # head dim 128, the kernel's lane width (Qwen2.5-VL's)
  devices, _ = topology_devices("tpu:v5e:1x1")
  lowered = []
  segment = plan_engine.segment_jit

  weights = []

  class Recording:
    def lower(self, *args, **kw):
      weights.append(args[1:3])  # the decode layers and LM head
      lowered.append(segment.lower(*args, **kw))
      return lowered[-1]

  monkeypatch.setattr(plan_engine, "segment_jit", Recording())
  # not into the persistent cache: a TPU executable cannot be read back on a CPU host (a warning, then a recompile)
  cached = jax.config.jax_persistent_cache_min_compile_time_secs
  jax.config.update("jax_persistent_cache_min_compile_time_secs", float("inf"))
  try:
    results = []
    for setting in ("auto", "reference"):
      c.rollout.attention = setting
      results.append(plan(c, cfg, devices, 16.0, ("decode",), text=8))
  finally:
    jax.config.update("jax_persistent_cache_min_compile_time_secs", cached)
  # each plan lowers the segment at its slots, then at twice as many (the slots that fit)
  kernel, reference = (x.as_text().count("tpu_custom_call") for x in lowered[::2])
  assert kernel > 0 and reference == 0  # (the layers' calls may share one outlined function)
  layers, head = weights[0]  # the TPU's layout: no CPU row blocks (3-D kernels), the head read from the params
  assert head is None and max(x.ndim for x in jax.tree.leaves(layers)) == 2
  assert [r["engine"]["attention"] for r in results] == ["tpu", "reference"]
  e = results[0]["engine"]
  # every slot at its longest: read_pages pages of 16 tokens x 2 heads x 128 (bfloat16), keys and values, 2 layers
  assert e["read_bytes"] == 4 * e["read_pages"] * 16 * 2 * 128 * 2 * 2 * text.num_hidden_layers
  assert "JAX's Pallas paged-attention kernel (tpu)" in format_plan(results[0])
  assert "Pallas" not in format_plan(results[1])
