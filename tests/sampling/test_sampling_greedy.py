"""Greedy decoding equals `transformers` generate(do_sample=False) token for token on tiny random models."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcap.checkpoint import load_hf_checkpoint
from jaxcap.sampling import Sampler, SamplingConfig
from sampling_fixtures import PADDED_BATCH, TWO_IMAGES, hf_greedy, tiny_checkpoint

NEW = 10


@pytest.fixture(scope="module", params=[0, 1], ids=["seed0", "seed1"])
def models(request, tmp_path_factory):
  return tiny_checkpoint(tmp_path_factory.mktemp(f"greedy{request.param}"), request.param)


def _assert_same(tokens, want, pad_id):
  want = np.pad(want, ((0, 0), (0, NEW - want.shape[1])), constant_values=pad_id)  # HF stops when all rows did
  np.testing.assert_array_equal(np.asarray(tokens), want)


@pytest.mark.parametrize("name,conversations", [("padded_batch", PADDED_BATCH), ("two_images", TWO_IMAGES)])
def test_greedy_equals_transformers(models, name, conversations):
  ref, model, proc = models
  eos = proc.cfg.eos_token_id
  sampler = Sampler(model, processor=proc, sampling=SamplingConfig(temperature=0, max_new_tokens=NEW))
  got = sampler(conversations, jax.random.key(0))
  _assert_same(got.tokens, hf_greedy(ref, proc, conversations, [eos], NEW), sampler.pad_id)
  assert got.text is not None and len(got.text) == len(conversations)


def test_greedy_per_sequence_stop_and_shared_prefill(models):
  """Stop ids taken from the reference's own output make rows stop at different steps; G copies agree."""
  ref, model, proc = models
  free = hf_greedy(ref, proc, PADDED_BATCH, [proc.cfg.eos_token_id], NEW)
  stops = (int(free[0, 2]), int(free[1, 5]))  # row 0 stops by step 2, row 1 by step 5
  want = hf_greedy(ref, proc, PADDED_BATCH, stops, NEW)
  sampler = Sampler(model, processor=proc, sampling=SamplingConfig(temperature=0, max_new_tokens=NEW, stop_ids=stops))
  got = sampler(PADDED_BATCH, jax.random.key(0), num_samples=3)
  tokens = np.asarray(got.tokens).reshape(3, 3, NEW)
  for g in range(3):
    _assert_same(tokens[:, g], want, sampler.pad_id)
  lengths = np.asarray(got.lengths).reshape(3, 3)
  assert lengths[0, 0] <= 3 and lengths[1, 0] <= 6
  np.testing.assert_array_equal(np.asarray(got.completion_mask).sum(1), np.asarray(got.lengths))
  assert np.all(np.asarray(got.prompt_index) == np.repeat(np.arange(3), 3))


@pytest.mark.slow
def test_float32_masters_sample_exactly_like_their_bfloat16_copy(models, tmp_path):
  """With bf16 compute, decoding reads a bf16 copy of f32 master weights made once per call: tokens and both
  log-probs equal those of a model whose weights are stored in bf16."""
  _, _, proc = models
  directory = tmp_path / "ckpt"
  ref, _, _ = tiny_checkpoint(directory, 3)
  del ref
  masters = load_hf_checkpoint(directory, dtype=jnp.bfloat16)  # f32 weights, bf16 compute
  copies = load_hf_checkpoint(directory, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
  sampling = SamplingConfig(temperature=1.0, max_new_tokens=NEW, stop_ids=())
  got, want = (
    Sampler(m, processor=proc, sampling=sampling)(PADDED_BATCH, jax.random.key(7), num_samples=2)
    for m in (masters, copies)
  )
  np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(want.tokens))
  np.testing.assert_array_equal(np.asarray(got.sample_logprobs), np.asarray(want.sample_logprobs))
  np.testing.assert_array_equal(np.asarray(got.policy_logprobs), np.asarray(want.policy_logprobs))


def _decode_temp_bytes(sampler, params, rows: int) -> int:
  """Temporary bytes of the compiled decode program for `rows` text prompts of 16 tokens, reading `params`."""
  import functools

  from jaxcap.sampling import generate
  from jaxcap.sampling.prompts import Prompts

  spec = jax.ShapeDtypeStruct
  prompts = Prompts(
    spec((rows, 16), jnp.int32), spec((rows, 16), bool), spec((3, rows, 16), jnp.int32), spec((rows,), jnp.int32)
  )
  static = generate.static_arguments(sampler.graphdef, sampler.sampling, sampler.cfg.eos_token_id, sampler.pad_id)
  prefill = functools.partial(generate.prefill, num_samples=1, **static)
  state = jax.eval_shape(prefill, params, prompts, spec((2,), jnp.uint32))
  return generate.decode_jit.lower(params, state, **static).compile().memory_analysis().temp_size_in_bytes


@pytest.mark.slow
def test_a_sampler_that_owns_its_weights_holds_one_copy_and_decodes_the_same(models):
  """`owns_weights=True` (the annotator's sampler) lays the weights out for decoding once, in place of the model's
  own: the live arrays do not grow, greedy tokens equal transformers', and the decode program no longer builds a
  copy of the decoder's kernels (its temporaries shrink by at least their size)."""
  from flax import nnx

  from jaxcap.sampling.decode_layout import DecodeWeights

  ref, model, proc = models
  graphdef, state = nnx.split(model)
  mine = nnx.merge(graphdef, jax.tree.map(jnp.copy, state))  # the fixture's model stays usable
  live = lambda: sum(a.nbytes for a in jax.live_arrays())
  sampling = SamplingConfig(temperature=0, max_new_tokens=NEW)
  before = live()
  sampler = Sampler(mine, processor=proc, sampling=sampling, owns_weights=True)
  assert isinstance(sampler.params, DecodeWeights)
  assert live() <= before  # the model's stacked and head arrays were replaced, not copied
  got = sampler(PADDED_BATCH, jax.random.key(0))
  _assert_same(got.tokens, hf_greedy(ref, proc, PADDED_BATCH, [proc.cfg.eos_token_id], NEW), sampler.pad_id)
  kernels = sum(a.nbytes for p, a in jax.tree_util.tree_leaves_with_path(state["layers"]) if "kernel" in str(p))
  plain = _decode_temp_bytes(sampler, state, 4)
  held = _decode_temp_bytes(sampler, sampler.params, 4)
  assert plain - held >= kernels, (plain, held, kernels)
