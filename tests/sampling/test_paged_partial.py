"""The paged engine over a stream of chunks (partial rollouts: jaxcap.sampling.chunk_feed, scheduler.shard's `feed`):
with one set of weights each chunk gets the tokens one call over all of them would give it, through reused output
rows, at most two chunks at once and a pool grown as chunks arrive; with the weights changing as chunks finish,
each token's version is recorded and a sample in flight continues under the next version."""

import jax
import numpy as np
import pytest

from jaxcap.sampling import SamplingConfig
from jaxcap.sampling.engine import EngineConfig, PagedSampler
from jaxcap.sampling.generate import compute_dtype_params
from jaxcap.sampling.scheduler import run_to_end
from sampling_fixtures import PADDED_BATCH, tiny_checkpoint

NEW, G = 10, 2
SMALL = EngineConfig(slots=3, page_size=4, segment_steps=3)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  return tiny_checkpoint(tmp_path_factory.mktemp("partial"), 0)


class _Feed:
  """Chunks at hand one by one (the pool is sized for the first), weights version = the oldest unfinished chunk."""

  ahead = 1

  def __init__(self, chunks, weights):
    self.chunks, self.versions = chunks, weights
    self.blocks = [c.block for c in chunks]
    self.ring = 2 * chunks[0].block
    self.done, self.asked = {}, []

  def available(self):
    return self.chunks[:1]

  def chunk(self, c):
    self.asked.append((c, len(self.done)))
    return self.chunks[c]

  def weights(self, oldest):
    # asked only for the stream's oldest unfinished chunk: every chunk before it is back (a loop publishing versions
    # as it takes rounds would otherwise wait forever)
    assert all(c in self.done for c in range(oldest)), (oldest, sorted(self.done))
    v = min(oldest, len(self.versions) - 1)
    return self.versions[v], v

  def finished(self, c, arrays, versions):
    self.done[c] = (jax.device_get(arrays), versions)


def _chunks(sampler):
  pairs = [PADDED_BATCH[:2], PADDED_BATCH[1:3], [PADDED_BATCH[2], PADDED_BATCH[0]]]
  return [sampler.bucket(p) for p in pairs]


def test_a_stream_gives_each_chunk_the_tokens_of_one_call(models):
  _, model, proc = models
  sampling = SamplingConfig(temperature=1.0, max_new_tokens=NEW, stop_ids=())
  sampler = PagedSampler(model, processor=proc, sampling=sampling, engine=SMALL)
  chunks = _chunks(sampler)
  eager = sampler.stream(chunks, jax.random.key(3), num_samples=G)
  feed = _Feed(chunks, [compute_dtype_params(sampler.params, sampler.cfg.dtype)])
  assert run_to_end(sampler.rounds(feed, jax.random.key(3), num_samples=G)) is None
  assert sorted(feed.done) == [0, 1, 2]
  assert all(c <= finished + 1 for c, finished in feed.asked)  # chunk c entered once chunk c - 2 had finished
  for c, want in enumerate(eager):
    got, versions = feed.done[c]
    np.testing.assert_array_equal(got.tokens, np.asarray(want.arrays.tokens))
    np.testing.assert_array_equal(got.lengths, np.asarray(want.arrays.lengths))
    np.testing.assert_allclose(got.sample_logprobs, np.asarray(want.arrays.sample_logprobs), atol=1e-5)
    emitted = np.arange(NEW)[None, :] < got.lengths[:, None]
    assert (versions[emitted] == 0).all() and (versions[~emitted] == -1).all()


def test_samples_in_flight_continue_under_the_next_weights_and_record_their_versions(models):
  _, model, proc = models
  sampling = SamplingConfig(temperature=1.0, max_new_tokens=NEW, stop_ids=())
  sampler = PagedSampler(model, processor=proc, sampling=sampling, engine=SMALL)
  chunks = _chunks(sampler)
  base = compute_dtype_params(sampler.params, sampler.cfg.dtype)
  other = jax.tree.map(lambda x: x * 1.5 if x.ndim == 2 else x, base)  # another policy: other tokens
  feed = _Feed(chunks, [base, other, other])
  run_to_end(sampler.rounds(feed, jax.random.key(3), num_samples=G))
  eager = sampler.stream(chunks[:1], jax.random.key(3), num_samples=G)[0]
  got, versions = feed.done[0]
  np.testing.assert_array_equal(got.tokens, np.asarray(eager.arrays.tokens))  # the oldest chunk: version 0 only
  mixed = False
  for c in (1, 2):
    got, versions = feed.done[c]
    emitted = np.arange(NEW)[None, :] < got.lengths[:, None]
    assert set(np.unique(versions[emitted])) <= {c - 1, c}
    for row, n in zip(versions, got.lengths):
      assert (np.diff(row[:n]) >= 0).all()  # a sample moves to the next version, never back
    mixed |= bool(((versions == c - 1).any(1) & (versions == c).any(1)).any())
  assert mixed  # some sample started under one version and finished under the next


@pytest.mark.parametrize("devices", [2, 4])
def test_a_stream_over_a_mesh_gives_each_chunk_the_one_device_tokens(models, devices):
  """One engine per device over its block of every chunk (jaxcap.sampling.mesh_stream; with 4 devices, one prompt
  of a chunk each, so a device finishes its block long before the others): each chunk comes back assembled, with
  the tokens one call on one device gives it; no device asks for the weights of a chunk while an earlier one is
  unfinished on another."""
  from jaxcap.sharding import make_mesh

  _, model, proc = models
  sampling = SamplingConfig(temperature=1.0, max_new_tokens=NEW, stop_ids=())
  sampler = PagedSampler(model, processor=proc, sampling=sampling, engine=SMALL)
  chunks = _chunks(sampler)
  eager = sampler.stream(chunks, jax.random.key(3), num_samples=G)
  base = compute_dtype_params(sampler.params, sampler.cfg.dtype)
  feed = _Feed(chunks, [base, base, base])
  with jax.set_mesh(make_mesh({"data": devices}, jax.devices()[:devices])):
    run_to_end(sampler.rounds(feed, jax.random.key(3), num_samples=G))
  assert sorted(feed.done) == [0, 1, 2]
  for c, want in enumerate(eager):
    got, versions = feed.done[c]
    np.testing.assert_array_equal(got.tokens, np.asarray(want.arrays.tokens))
    np.testing.assert_array_equal(got.lengths, np.asarray(want.arrays.lengths))
    emitted = np.arange(NEW)[None, :] < got.lengths[:, None]
    assert set(np.unique(versions[emitted])) <= {max(c - 1, 0), c}  # the same weights under three version numbers
