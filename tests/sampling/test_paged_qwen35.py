"""The paged rollout engine on Qwen3.5 (hybrid decoder: Gated DeltaNet layers with a fixed-size state per row beside
the paged full-attention layers): each prompt's linear states kept per prompt in flight, copied into every slot one
of its samples enters, advanced by live slots only. Greedy tokens equal the static sampler's and transformers'
generate with few slots (slots reused by other prompts' samples); sampled tokens do not depend on the slots, pages
or segments, and their log-probs are a teacher-forced pass's; a mesh and a stream of chunks give the one-device
engine's rollouts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from jaxcap.checkpoint import load_hf_checkpoint
from jaxcap.models.qwen35 import Qwen35
from jaxcap.models.qwen35_presets import qwen35_tiny
from jaxcap.processing import Processor, word_tokenizer
from jaxcap.sampling import Sampler, SamplingConfig
from jaxcap.sampling.engine import EngineConfig, PagedSampler
from jaxcap.sampling.footprint import sampling_footprint
from jaxcap.sampling.generate import compute_dtype_params
from jaxcap.sampling.page_budget import state_rows
from jaxcap.sampling.paged_cache import PagePool
from jaxcap.sampling.paged_slots import Slots
from jaxcap.sampling.scheduler import run_to_end
from jaxcap.sharding import make_mesh
from hf_reference import WORDS
from sampling_fixtures import PADDED_BATCH, hf_greedy

NEW, G = 8, 2
# 2 slots for 3 prompts x 2 samples: every slot is refilled, by a sample of another prompt than the one it held
FEW = EngineConfig(slots=2, page_size=4, segment_steps=3)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  """(transformers reference, jaxcap Qwen3.5, processor) sharing random weights (norms and dt_bias perturbed)."""
  directory = tmp_path_factory.mktemp("paged_qwen35")
  cfg = qwen35_tiny()
  torch.manual_seed(0)
  hc = transformers.Qwen3_5Config(**cfg.to_hf_dict())
  hc._attn_implementation = "eager"
  ref = transformers.Qwen3_5ForConditionalGeneration(hc).float().eval()
  with torch.no_grad():
    for name, p in ref.named_parameters():
      if ("norm" in name and name.endswith("weight")) or name.endswith("dt_bias"):
        p.add_(0.1 * torch.randn_like(p))
  ref.save_pretrained(directory)
  model = load_hf_checkpoint(directory)
  assert isinstance(model, Qwen35)
  return ref, model, Processor(word_tokenizer(WORDS, cfg), cfg)


def _hf_greedy(ref, proc, stop_ids):
  out = hf_greedy(ref, proc, PADDED_BATCH, stop_ids, NEW)
  return np.pad(out, ((0, 0), (0, NEW - out.shape[1])), constant_values=proc.tokenizer.pad_token_id)


def test_greedy_equals_static_sampler_and_transformers(models):
  """Rows stop at different steps (stop ids from the reference's own output); 6 samples through 2 slots, so each
  slot is refilled with another prompt's sample: every sample's tokens and log-probs still equal the static
  sampler's, and transformers' generate. A refill that kept the slot's previous state would continue another
  prompt's recurrence."""
  ref, model, proc = models
  free = _hf_greedy(ref, proc, [proc.cfg.eos_token_id])
  stops = (int(free[0, 2]), int(free[1, 5]))
  want = _hf_greedy(ref, proc, stops)
  sampling = SamplingConfig(temperature=0, max_new_tokens=NEW, stop_ids=stops)
  static = Sampler(model, processor=proc, sampling=sampling)(PADDED_BATCH, jax.random.key(0), num_samples=G)
  stats = {}
  got = PagedSampler(model, processor=proc, sampling=sampling, engine=FEW)(
    PADDED_BATCH, jax.random.key(0), num_samples=G, stats=stats
  )
  tokens = np.asarray(got.tokens)
  np.testing.assert_array_equal(tokens, np.asarray(static.tokens))
  np.testing.assert_array_equal(np.asarray(got.lengths), np.asarray(static.lengths))
  np.testing.assert_allclose(np.asarray(got.policy_logprobs), np.asarray(static.policy_logprobs), atol=1e-5)
  np.testing.assert_array_equal(tokens.reshape(-1, G, NEW)[:, 0], want)
  np.testing.assert_array_equal(tokens.reshape(-1, G, NEW)[:, 1], want)  # each sample its own copy of the state
  assert len({tuple(r) for r in want}) == len(want)  # the prompts' rollouts differ: a wrong state would show
  assert stats["segments"] > 2 and stats["free_pages"] == stats["pages"] - 1
  assert stats["free_state_rows"] == stats["state_rows"] == FEW.slots + 4  # a bucket of 4 prompts; all given back


def _teacher_forced(model, proc, tokens):
  """Policy log-probs [B * G, N] of `tokens` under one uncached pass over prompt + tokens (the chunked rule)."""
  batch = proc([c for c in PADDED_BATCH for _ in range(G)], padding_side="left")
  t = batch.input_ids.shape[1]
  start = batch.positions.max(axis=(0, 2)) + 1
  positions = np.concatenate([batch.positions, np.broadcast_to(start[:, None] + np.arange(NEW), (3, *tokens.shape))], 2)
  attn = np.concatenate([batch.attention_mask, np.ones_like(tokens, bool)], 1)
  x = jnp.concatenate([model.embed(jnp.asarray(batch.input_ids), batch.vision()), model.embed(jnp.asarray(tokens))], 1)
  hidden, _ = model.decode(x, jnp.asarray(positions), jnp.asarray(attn))
  logits = jax.nn.log_softmax(model.logits(hidden)[:, t - 1 : t - 1 + NEW])
  return np.take_along_axis(np.asarray(logits), tokens[..., None], -1)[..., 0]


def test_sampled_tokens_do_not_depend_on_slots_pages_or_segments(models):
  """Temperature 1: the same key gives every sample the same tokens with 2 or 8 slots, pages of 4 or 16 tokens and
  segments of 3 or 32 steps (draws keyed by prompt, sample and position), the G samples of a prompt (each from a
  copy of its prompt's state) differ, and their log-probs are those of a teacher-forced pass."""
  _, model, proc = models
  sampling = SamplingConfig(temperature=1.0, max_new_tokens=NEW, stop_ids=())
  runs = [
    PagedSampler(model, processor=proc, sampling=sampling, engine=e)(PADDED_BATCH, jax.random.key(5), num_samples=G)
    for e in (FEW, EngineConfig(slots=8, page_size=16, segment_steps=32))
  ]
  tokens = np.asarray(runs[0].tokens)
  np.testing.assert_array_equal(np.asarray(runs[1].tokens), tokens)
  np.testing.assert_allclose(np.asarray(runs[1].policy_logprobs), np.asarray(runs[0].policy_logprobs), atol=1e-5)
  assert not np.array_equal(tokens[0::G], tokens[1::G])
  want = _teacher_forced(model, proc, tokens)
  np.testing.assert_allclose(np.asarray(runs[0].policy_logprobs), want, atol=2e-5, rtol=0)


class _Feed:
  """A stream of chunks (partial rollouts), one set of weights, at most one chunk beyond the oldest unfinished."""

  ahead = 1

  def __init__(self, chunks, params):
    self.chunks, self.params = chunks, params
    self.blocks = [c.block for c in chunks]
    self.ring = 2 * chunks[0].block
    self.done = {}

  def available(self):
    return self.chunks[:1]

  def chunk(self, c):
    return self.chunks[c]

  def weights(self, oldest):
    return self.params, 0

  def finished(self, c, arrays, versions):
    self.done[c] = jax.device_get(arrays)


@pytest.mark.slow
def test_a_mesh_and_a_stream_give_the_one_device_rollouts(models):
  """Sampled: a 2-device data mesh (one engine per block of prompts), a stream of chunks (partial rollouts: reused
  output rows, two chunks in flight) and that stream over the mesh give each chunk the tokens of one call on one
  device."""
  _, model, proc = models
  sampling = SamplingConfig(temperature=1.0, max_new_tokens=NEW, stop_ids=())
  sampler = PagedSampler(model, processor=proc, sampling=sampling, engine=FEW)
  chunks = [sampler.bucket(p) for p in (PADDED_BATCH[:2], PADDED_BATCH[1:3], [PADDED_BATCH[2], PADDED_BATCH[0]])]
  want = sampler.stream(chunks, jax.random.key(3), num_samples=G)
  params = compute_dtype_params(sampler.params, sampler.cfg.dtype)
  feed, meshed_feed = _Feed(chunks, params), _Feed(chunks, params)
  assert run_to_end(sampler.rounds(feed, jax.random.key(3), num_samples=G)) is None
  with jax.set_mesh(make_mesh({"data": 2}, jax.devices()[:2])):
    meshed = sampler.stream(chunks, jax.random.key(3), num_samples=G)
    run_to_end(sampler.rounds(meshed_feed, jax.random.key(3), num_samples=G))
  for c, one in enumerate(want):
    for got in (meshed[c].arrays, feed.done[c], meshed_feed.done[c]):
      np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(one.arrays.tokens))
      np.testing.assert_allclose(np.asarray(got.policy_logprobs), np.asarray(one.arrays.policy_logprobs), atol=1e-5)


def test_memory_counts_the_attention_layers_keys_and_every_rows_linear_states():
  """The tiny preset's 6 layers are 4 linear and 2 full-attention: the KV cache (static sampler's footprint, the
  engine's pool) has 2 layers, and every row (a static row, a decode slot, a prompt in flight) holds 4 layers'
  conv inputs (3 x 160 channels) and float32 delta states (4 heads x 16 x 24)."""
  cfg = qwen35_tiny()
  t = cfg.text
  assert t.kv_layers == 2 and t.conv_dim == 2 * 2 * 16 + 4 * 24
  per_row = 4 * (3 * t.conv_dim * 4 + 4 * 16 * 24 * 4)
  assert t.recurrent_bytes(jnp.float32) == per_row
  fp = sampling_footprint(cfg, 8, 20, 12)
  assert fp.kv_cache == 2 * 2 * 8 * t.num_key_value_heads * t.head_dim * 32 * 4
  assert fp.recurrent == 8 * per_row and fp.running == fp.decode_layout + fp.kv_cache + fp.recurrent + fp.activations
  assert "recurrent states" in fp.describe("float32")
  pool = jax.eval_shape(lambda: PagePool.for_model(cfg, 9, 4, state_rows(3, [4, 2])))
  assert len(pool.k) == 2 and pool.k[0].shape == (t.num_key_value_heads, 9, 4, t.head_dim)
  assert [s.conv.shape[0] for s in pool.states] == [3 + 4] * 4
  slots = jax.eval_shape(lambda: Slots.empty(3, 10, Qwen35.empty_states(cfg, 3)))
  assert sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(slots.states)) == 3 * per_row
