"""The paged rollout engine (jaxcap.sampling.engine): same rollouts as the static sampler and `transformers`, per-
sample random streams independent of scheduling, log-probs of a teacher-forced pass, pages all given back."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcap.models import row_blocks
from jaxcap.models.qwen25vl import cached_attention
from jaxcap.sampling import Sampler, SamplingConfig
from jaxcap.sampling.engine import EngineConfig, PagedSampler
from jaxcap.sampling.paged_attention import paged_attention
from jaxcap.sampling.paged_decode import _draw, sample_uniforms
from jaxcap.sampling.paged_slots import TRACE_COUNTS
from sampling_fixtures import PADDED_BATCH, hf_greedy, image, tiny_checkpoint, user

draw = jax.jit(_draw, static_argnums=(4, 5))
uniforms = jax.jit(sample_uniforms, static_argnums=(3,))

NEW, G = 10, 2
# few slots and short segments: samples are admitted, finish, free their pages and are replaced mid-rollout
SMALL = EngineConfig(slots=3, page_size=4, segment_steps=3)
VIDEO_BATCH = [
  [{"role": "user", "content": [{"type": "video", "video": [image(10 + i, 84, 112) for i in range(4)], "fps": 1.0}]}],
  user(image(6, 112, 140), "what colour is it ?"),
  user("a red square"),
]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  return tiny_checkpoint(tmp_path_factory.mktemp("paged"), 0)


def _hf_greedy(ref, proc, conversations, stop_ids):
  out = hf_greedy(ref, proc, conversations, stop_ids, NEW)
  return np.pad(out, ((0, 0), (0, NEW - out.shape[1])), constant_values=proc.tokenizer.pad_token_id)


@pytest.mark.parametrize(
  "name,conversations",
  [("mixed_sizes_and_text", PADDED_BATCH), pytest.param("video", VIDEO_BATCH, marks=pytest.mark.slow)],
)
def test_greedy_equals_static_sampler_and_transformers(models, name, conversations):
  """Rows stop at different steps (stop ids from the reference's own output), so slots are refilled and compacted;
  every sample's tokens still equal the static sampler's and transformers' generate."""
  ref, model, proc = models
  free = _hf_greedy(ref, proc, conversations, [proc.cfg.eos_token_id])
  stops = (int(free[0, 2]), int(free[1, 5]))
  want = _hf_greedy(ref, proc, conversations, stops)
  sampling = SamplingConfig(temperature=0, max_new_tokens=NEW, stop_ids=stops)
  static = Sampler(model, processor=proc, sampling=sampling)(conversations, jax.random.key(0), num_samples=G)
  stats = {}
  got = PagedSampler(model, processor=proc, sampling=sampling, engine=SMALL)(
    conversations, jax.random.key(0), num_samples=G, stats=stats
  )
  np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(static.tokens))
  np.testing.assert_array_equal(np.asarray(got.lengths), np.asarray(static.lengths))
  np.testing.assert_array_equal(np.asarray(got.tokens).reshape(-1, G, NEW)[:, 0], want)
  np.testing.assert_array_equal(np.asarray(got.completion_mask).sum(1), np.asarray(got.lengths))
  assert got.text is not None and len(got.text) == len(conversations) * G
  assert stats["segments"] > 1 and stats["free_pages"] == stats["pages"] - 1  # every page given back


@pytest.mark.slow
def test_sampled_tokens_do_not_depend_on_slots_pages_or_segments(models, monkeypatch):
  """Temperature 1: the same key gives every sample the same tokens with 2 / 4 / all slots, pages of 4 / 8 / 16
  tokens and segments of 1 / 3 / 32 steps (its logits agree to float rounding across these batch shapes, see
  test_draws_depend_only_on_logits_and_sample), and the G samples of a prompt differ. Row blocks stop at 4 rows
  here: 8 slots decode with the plain weight layout (as on GPU / TPU, or over 64 slots on CPU), their compacted
  tails in row blocks."""
  monkeypatch.setattr(row_blocks, "MAX_ROWS", 4)
  _, model, proc = models
  sampling = SamplingConfig(temperature=1.0, max_new_tokens=NEW, stop_ids=())
  configs = [EngineConfig(2, 4, 3), EngineConfig(4, 8, 1), EngineConfig(8, 16, 32)]
  runs = [
    PagedSampler(model, processor=proc, sampling=sampling, engine=e)(PADDED_BATCH, jax.random.key(5), num_samples=G)
    for e in configs
  ]
  for run in runs[1:]:
    np.testing.assert_array_equal(np.asarray(run.tokens), np.asarray(runs[0].tokens))
    np.testing.assert_allclose(np.asarray(run.policy_logprobs), np.asarray(runs[0].policy_logprobs), atol=1e-5)
  tokens = np.asarray(runs[0].tokens)
  assert not np.array_equal(tokens[0::G], tokens[1::G])
  before = dict(TRACE_COUNTS)  # a second call of the same shapes compiles no program of the engine
  again = PagedSampler(model, processor=proc, sampling=sampling, engine=configs[0])(
    PADDED_BATCH, jax.random.key(5), num_samples=G
  )
  assert dict(TRACE_COUNTS) == before
  np.testing.assert_array_equal(np.asarray(again.tokens), tokens)


def test_per_sample_uniforms_are_keyed_by_sample_and_position_only():
  """The draws of output row r at token k are the same whichever rows share the batch and in whatever order."""
  key = jax.random.key(3)
  rows = jnp.arange(12, dtype=jnp.int32)
  position = jnp.asarray([0, 1, 2, 5, 7, 9, 0, 3, 4, 8, 6, 1], jnp.int32)
  whole = np.asarray(uniforms(key, rows, position, 3))
  order = np.asarray([7, 2, 11, 0, 5])
  part = np.asarray(uniforms(key, rows[order], position[order], 3))
  np.testing.assert_array_equal(part, whole[order])
  assert len(np.unique(whole)) == len(whole)  # no two (sample, position) pairs share a stream
  # row r = prompt * G + g: rows 0 and 3 are sample 0 of prompts 0 and 1 at the same position
  a = uniforms(key, jnp.asarray([0, 3]), jnp.asarray([4, 4]), 3)
  assert a[0] != a[1]


def test_draws_depend_only_on_logits_and_sample():
  """Bitwise-equal logits give bitwise-equal tokens and log-probs, whichever slot a sample sits in."""
  logits = jax.random.normal(jax.random.key(0), (6, 300)) * 3
  rows = jnp.asarray([4, 9, 0, 13, 2, 7], jnp.int32)
  position = jnp.asarray([3, 0, 8, 1, 1, 5], jnp.int32)
  perm = np.asarray([3, 0, 5, 1, 4, 2])
  for sampling in (SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.7, top_p=0.9, top_k=50)):
    want = draw(jax.random.key(1), logits, rows, position, sampling, 4)
    got = draw(jax.random.key(1), logits[perm], rows[perm], position[perm], sampling, 4)
    for w, gt in zip(want, got):
      np.testing.assert_array_equal(np.asarray(gt), np.asarray(w)[perm])


@pytest.mark.slow
def test_logprobs_equal_teacher_forced(models):
  """Behaviour (tempered, nucleus) and policy log-probs within 1e-5 of an uncached forward over prompt + tokens."""
  _, model, proc = models
  sampling = SamplingConfig(temperature=0.7, top_p=0.9, max_new_tokens=NEW, stop_ids=())
  out = PagedSampler(model, processor=proc, sampling=sampling, engine=SMALL)(
    PADDED_BATCH, jax.random.key(3), num_samples=G
  )
  batch = proc([c for c in PADDED_BATCH for _ in range(G)], padding_side="left")
  tokens = np.asarray(out.tokens)
  t = batch.input_ids.shape[1]
  start = batch.positions.max(axis=(0, 2)) + 1
  positions = np.concatenate([batch.positions, np.broadcast_to(start[:, None] + np.arange(NEW), (3, *tokens.shape))], 2)
  attn = np.concatenate([batch.attention_mask, np.ones_like(tokens, bool)], 1)
  x = jnp.concatenate([model.embed(jnp.asarray(batch.input_ids), batch.vision()), model.embed(jnp.asarray(tokens))], 1)
  hidden, _ = model.decode(x, jnp.asarray(positions), jnp.asarray(attn))
  logits = np.asarray(model.logits(hidden), np.float64)[:, t - 1 : t - 1 + NEW]
  gather = lambda lp: np.take_along_axis(lp, tokens[..., None], -1)[..., 0]
  log_softmax = lambda z: (
    z - z.max(-1, keepdims=True) - np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True))
  )
  np.testing.assert_allclose(np.asarray(out.policy_logprobs), gather(log_softmax(logits)), atol=1e-5, rtol=0)
  z = logits / 0.7
  order = np.argsort(-z, -1)
  p = np.exp(log_softmax(np.take_along_axis(z, order, -1)))
  keep = np.zeros(z.shape, bool)
  np.put_along_axis(keep, order, (np.cumsum(p, -1) - p) < 0.9, -1)
  sampled = gather(log_softmax(np.where(keep, z, -np.inf)))
  np.testing.assert_allclose(np.asarray(out.sample_logprobs), sampled, atol=1e-5, rtol=0)


def test_paged_attention_equals_cached_attention():
  """The jnp reference over scattered pages equals `cached_attention` over the same keys laid out contiguously."""
  r, n_heads, kv_heads, h, z, n = 3, 4, 2, 8, 4, 5
  rng = np.random.RandomState(0)
  pool_k = rng.randn(kv_heads, 20, z, h).astype(np.float32)
  pool_v = rng.randn(kv_heads, 20, z, h).astype(np.float32)
  table = np.stack([rng.permutation(np.arange(1, 20))[:n] for _ in range(r)]).astype(np.int32)
  length = np.asarray([17, 1, 20])
  visible = np.arange(n * z) < length[:, None]  # a prefix of each row's pages
  q = rng.randn(r, n_heads, h).astype(np.float32)
  got = paged_attention(
    jnp.asarray(q), jnp.asarray(pool_k), jnp.asarray(pool_v), jnp.asarray(length, jnp.int32), jnp.asarray(table), 0.3
  )
  keys = pool_k[:, table].reshape(kv_heads, r, n * z, h).transpose(1, 2, 0, 3)  # [R, S, K, H]
  values = pool_v[:, table].reshape(kv_heads, r, n * z, h).transpose(1, 2, 0, 3)
  want = cached_attention(
    jnp.asarray(q[:, None]),
    jnp.asarray(keys.transpose(0, 2, 3, 1)),
    jnp.asarray(values.transpose(0, 2, 1, 3)),
    jnp.asarray(visible[:, None, None, :]),
    0.3,
  )[:, 0]
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6, rtol=0)


def test_prompt_over_the_page_budget_is_refused(models):
  _, model, proc = models
  engine = EngineConfig(slots=2, page_size=4, segment_steps=3, pages=6)
  sampler = PagedSampler(model, processor=proc, sampling=SamplingConfig(max_new_tokens=NEW), engine=engine)
  with pytest.raises(ValueError, match=r"prompt 0 of chunk 0 needs .*rollout\.pages=6.*raise rollout\.pages"):
    sampler(PADDED_BATCH, jax.random.key(0))
  with pytest.raises(ValueError, match="rollout.slots=0"):
    EngineConfig(slots=0)
