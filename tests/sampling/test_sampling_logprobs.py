"""Returned log-probs equal a teacher-forced forward pass over prompt + sampled completion (within 1e-4)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcap.sampling import Sampler, SamplingConfig
from sampling_fixtures import PADDED_BATCH, tiny_checkpoint

G, NEW = 2, 8


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  return tiny_checkpoint(tmp_path_factory.mktemp("logprobs"), 2)


def _teacher_forced_logits(model, proc, conversations, out):
  """Logits float32 [R, N, V] predicting each completion token, from one uncached forward of the full text."""
  batch = proc([c for c in conversations for _ in range(G)], padding_side="left")
  tokens, mask = np.asarray(out.tokens), np.asarray(out.completion_mask)
  t = batch.input_ids.shape[1]
  attn = np.concatenate([batch.attention_mask, mask], 1)
  start = batch.positions.max(axis=(0, 2)) + 1  # the k-th new token sits at max prompt position + 1 + k
  new_pos = np.broadcast_to(start[:, None] + np.arange(NEW), (3, *tokens.shape))
  positions = np.concatenate([batch.positions, new_pos], 2)
  # Completion tokens are embedded without vision, as when they were decoded: a random model may sample
  # <|image_pad|>, which must not pick up image features here.
  x = jnp.concatenate([model.embed(jnp.asarray(batch.input_ids), batch.vision()), model.embed(jnp.asarray(tokens))], 1)
  hidden, _ = model.decode(x, jnp.asarray(positions), jnp.asarray(attn))
  return np.asarray(model.logits(hidden))[:, t - 1 : t - 1 + NEW]


def _log_softmax(z):
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


def _gather(lp, tokens):
  return np.take_along_axis(lp, tokens[..., None], -1)[..., 0]


def _tempered_top_p(z, temperature, top_p):
  """numpy reference of the sampled distribution's log-probs [..., V] (-inf outside the nucleus)."""
  z = z / temperature
  order = np.argsort(-z, -1)
  p = np.exp(_log_softmax(np.take_along_axis(z, order, -1)))
  keep_sorted = (np.cumsum(p, -1) - p) < top_p
  keep = np.zeros_like(keep_sorted)
  np.put_along_axis(keep, order, keep_sorted, -1)
  return _log_softmax(np.where(keep, z, -np.inf))


@pytest.mark.parametrize(
  "sampling",
  [SamplingConfig(temperature=1.0, max_new_tokens=NEW), SamplingConfig(temperature=0.7, top_p=0.9, max_new_tokens=NEW)],
  ids=["t1", "t0.7_p0.9"],
)
def test_logprobs_equal_teacher_forced(models, sampling):
  _, model, proc = models
  sampler = Sampler(model, processor=proc, sampling=sampling)
  out = sampler(PADDED_BATCH, jax.random.key(3), num_samples=G)
  logits = _teacher_forced_logits(model, proc, PADDED_BATCH, out)
  tokens, mask = np.asarray(out.tokens), np.asarray(out.completion_mask)
  policy = _gather(_log_softmax(logits), tokens)
  np.testing.assert_allclose(np.asarray(out.policy_logprobs)[mask], policy[mask], atol=1e-4, rtol=0)
  sampled = _gather(_tempered_top_p(logits, sampling.temperature, sampling.top_p), tokens)
  np.testing.assert_allclose(np.asarray(out.sample_logprobs)[mask], sampled[mask], atol=1e-4, rtol=0)
  assert np.all(np.asarray(out.policy_logprobs)[~mask] == 0) and np.all(np.asarray(out.sample_logprobs)[~mask] == 0)
  # the G samples of a prompt share its prefill but draw different tokens
  assert not np.array_equal(tokens[0::G], tokens[1::G])


def test_same_key_reproduces_and_new_key_differs(models):
  _, model, proc = models
  sampler = Sampler(model, processor=proc, sampling=SamplingConfig(max_new_tokens=NEW))
  a, b = (np.asarray(sampler(PADDED_BATCH, jax.random.key(k), num_samples=G).tokens) for k in (7, 7))
  c = np.asarray(sampler(PADDED_BATCH, jax.random.key(8), num_samples=G).tokens)
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)
