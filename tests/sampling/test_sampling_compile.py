"""One compilation per bucket across calls; prompt bucketing; the same tokens on a sharded mesh."""

import jax
import numpy as np
import pytest
from flax import nnx

import jaxcap.models as M
from jaxcap.sampling import TRACE_COUNTS, Sampler, SamplingConfig, batch_bucket, bucket_prompts
from jaxcap.sharding import make_mesh
from sampling_fixtures import image, tiny_checkpoint, user


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory):
  return tmp_path_factory.mktemp("compile")


@pytest.fixture(scope="module")
def models(checkpoint_dir):
  return tiny_checkpoint(checkpoint_dir, 3)


def _batch(rows, seed, words):
  return [
    user(image(seed + i, 56, 84), " ".join(["describe the image"] + ["."] * ((i + words) % 4))) for i in range(rows)
  ]


def test_compiles_once_per_bucket(models):
  _, model, proc = models
  sampler = Sampler(model, processor=proc, sampling=SamplingConfig(max_new_tokens=6), length_multiple=32)
  sampler(_batch(4, 0, 0), jax.random.key(0), num_samples=2)
  before = dict(TRACE_COUNTS)
  # same bucket: other images of the same size, other prompt lengths, 3 rows padded to 4, other keys
  for rows, seed, words in [(4, 10, 1), (3, 20, 2), (4, 30, 3)]:
    out = sampler(_batch(rows, seed, words), jax.random.key(seed), num_samples=2)
    assert out.tokens.shape == (rows * 2, 6)
  assert dict(TRACE_COUNTS) == before, "a call of the same bucket recompiled"
  sampler(_batch(5, 40, 0), jax.random.key(1), num_samples=2)  # 5 rows -> bucket of 8: one more program
  assert TRACE_COUNTS["prefill"] == before["prefill"] + 1 and TRACE_COUNTS["decode"] == before["decode"] + 1


def test_bucketing_pads_rows_and_length(models):
  _, _, proc = models
  batch = proc(_batch(3, 0, 1), padding_side="left")
  prompts, rows, items = bucket_prompts(batch, proc.cfg, length_multiple=32, pad_id=7)
  assert rows == 3 and prompts.batch == batch_bucket(3) == 4 and prompts.length % 32 == 0
  pad = prompts.length - batch.input_ids.shape[1]
  np.testing.assert_array_equal(prompts.input_ids[:3, pad:], batch.input_ids)
  assert not prompts.attention_mask[:, :pad].any() and (prompts.input_ids[:, :pad] == 7).all()
  np.testing.assert_array_equal(prompts.input_ids[3], prompts.input_ids[2])  # extra row repeats the last one
  assert items.rows.tolist() == [0, 1, 2, 3] and len(items.grid_thw) == 4  # with its image
  real = 4 * batch.pixel_values.shape[0] // 3
  assert prompts.vision.pixel_values.shape[0] == items.patches >= real  # the pack padded to its bucket
  np.testing.assert_array_equal(prompts.vision.pixel_values[real:], 0)


def test_right_padded_prompts_are_rejected(models):
  _, model, proc = models
  batch = proc(_batch(2, 0, 0) + [user("a")], padding_side="right")
  with pytest.raises(ValueError, match="left-padded"):
    Sampler(model, processor=proc)(batch, jax.random.key(0))


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=0), dict(top_k=-2), dict(max_new_tokens=0)])
def test_sampling_config_names_bad_value(bad):
  with pytest.raises(ValueError, match=next(iter(bad))):
    SamplingConfig(**bad)


@pytest.mark.slow
def test_sharded_mesh_gives_same_tokens(models, checkpoint_dir):
  """Batch over ('data', 'fsdp'), heads over 'tensor' on 8 CPU devices: same samples as one device."""
  _, model, proc = models
  sampling = SamplingConfig(temperature=0.8, max_new_tokens=6)
  conversations = _batch(4, 50, 0)
  want = Sampler(model, processor=proc, sampling=sampling)(conversations, jax.random.key(5), num_samples=2)
  mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  with jax.set_mesh(mesh):
    sampler = Sampler.from_checkpoint(checkpoint_dir, mesh=mesh, sampling=sampling)
    got = sampler(conversations, jax.random.key(5), num_samples=2)
    assert len(got.tokens.sharding.device_set) == 8
  np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(want.tokens))
  np.testing.assert_allclose(np.asarray(got.policy_logprobs), np.asarray(want.policy_logprobs), atol=1e-5)


def test_model_with_remat_samples_like_without(models):
  """Activation checkpointing is for training; the sampler drops it and gives the same tokens."""
  _, model, proc = models
  sampling = SamplingConfig(temperature=0.8, max_new_tokens=4)
  conversations = _batch(2, 60, 0)
  want = Sampler(model, processor=proc, sampling=sampling)(conversations, jax.random.key(2))
  params = nnx.state(model)
  remat_model = nnx.merge(
    nnx.split(nnx.eval_shape(lambda: M.Qwen25VL(model.cfg.replace(remat="full"), rngs=nnx.Rngs(0))))[0], params
  )
  got = Sampler(remat_model, processor=proc, sampling=sampling)(conversations, jax.random.key(2))
  np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(want.tokens))
