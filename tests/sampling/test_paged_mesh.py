"""The paged rollout engine on a mesh (jaxcap.sampling.mesh_shards): each device's block of prompts decoded by its
own engine gives the one-device engine's rollouts, as global arrays laid out as the static sampler's."""

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from jaxcap.sampling import SamplingConfig
from jaxcap.sampling.engine import EngineConfig, PagedSampler
from jaxcap.sampling.mesh_shards import spread
from jaxcap.sharding import make_mesh
from sampling_fixtures import PADDED_BATCH, image, tiny_checkpoint, user

NEW, G = 10, 2
SMALL = EngineConfig(slots=3, page_size=4, segment_steps=3)
# 5 prompts (a bucket of 8): mixed image sizes and text-only rows, spread unevenly (the last block all padding)
BATCH = PADDED_BATCH + [user(image(7, 84, 56), "what is it ?"), user("a blue circle")]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  return tiny_checkpoint(tmp_path_factory.mktemp("paged_mesh"), 0)


def _run(model, proc, sampling, mesh, batches=(BATCH,), **kw):
  sampler = PagedSampler(model, processor=proc, sampling=sampling, engine=SMALL)
  if mesh is None:
    return sampler.stream(list(batches), jax.random.key(7), num_samples=G, **kw)
  with jax.set_mesh(mesh):
    return sampler.stream(list(batches), jax.random.key(7), num_samples=G, **kw)


def _same(got, want, *, atol):
  for a, b in zip(got, want):
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    np.testing.assert_array_equal(np.asarray(a.lengths), np.asarray(b.lengths))
    np.testing.assert_allclose(np.asarray(a.policy_logprobs), np.asarray(b.policy_logprobs), atol=atol)
    np.testing.assert_allclose(np.asarray(a.sample_logprobs), np.asarray(b.sample_logprobs), atol=atol)


def test_data_mesh_gives_the_one_device_rollouts(models):
  """Greedy, rows stopping at different steps: a 2- and a 4-device data mesh give the one-device engine's tokens,
  prompt-major, with outputs sharded over the data axis. (Sampled tokens, whose draws are keyed by prompt, sample
  and position: the mixed mesh below and tests/sampling/test_sampling_multiprocess.py.)"""
  _, model, proc = models
  sampling = SamplingConfig(temperature=0.0, max_new_tokens=NEW, stop_ids=())
  # stop ids from the free run's own tokens
  free = np.asarray(_run(model, proc, sampling, None)[0].tokens)
  sampling = SamplingConfig(temperature=0, max_new_tokens=NEW, stop_ids=(int(free[0, 2]), int(free[4, 5])))
  want = _run(model, proc, sampling, None)
  assert len(set(np.asarray(want[0].lengths).tolist())) > 2
  for size in (2, 4):
    stats = {}
    got = _run(model, proc, sampling, make_mesh({"data": size}, jax.devices()[:size]), stats=stats)
    _same(got, want, atol=1e-5)
    assert got[0].arrays.tokens.sharding.spec == PartitionSpec("data", None)
    assert stats["free_pages"] == stats["pages"] - size  # every engine gave back all its pages


@pytest.mark.slow
def test_streamed_chunks_and_replicas_on_a_mixed_mesh(models):
  """Two chunks of different sizes through one call on data 2 x tensor 2 (two engines, each output block held
  by two devices): each chunk's rollouts and `on_group` hand-overs are the one-device engine's."""
  _, model, proc = models
  sampling = SamplingConfig(temperature=1.0, max_new_tokens=NEW, stop_ids=())
  batches = (BATCH, PADDED_BATCH[:2])
  seen_one, seen_mesh = {}, {}
  want = _run(model, proc, sampling, None, batches, on_group=lambda p, t, n: seen_one.setdefault(p, t.copy()))
  mesh = make_mesh({"data": 2, "tensor": 2}, jax.devices()[:4])
  got = _run(model, proc, sampling, mesh, batches, on_group=lambda p, t, n: seen_mesh.setdefault(p, t.copy()))
  _same(got, want, atol=1e-5)
  assert sorted(seen_mesh) == sorted(seen_one) == [0, 1, 2, 3, 4, 8, 9]  # real prompts, numbered as the rows
  for p in seen_one:
    np.testing.assert_array_equal(seen_mesh[p], seen_one[p])
  assert len(got[1].arrays.tokens.sharding.device_set) == 4


def test_spread_blocks_follow_the_batch_axes():
  """Prompt blocks go to the mesh's batch axes ('data' x 'fsdp'), in mesh order; 'tensor' devices share one."""
  mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2}, jax.devices()[:8])
  plan = spread(mesh, [8, 4])
  assert plan.spec == PartitionSpec(("data", "fsdp"))
  assert plan.runners == [hs[0] for hs in plan.holders] and [len(h) for h in plan.holders] == [2] * 4
  first, ranges = plan.bounds(8, mesh)
  assert first == 0 and ranges == [(0, 2), (2, 4), (4, 6), (6, 8)]
  assert spread(mesh, [8, 2]).bounds(2, mesh)[1] == [(0, 1), (1, 2)]  # 2 prompts split over 'data' only
