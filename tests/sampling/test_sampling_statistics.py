"""Sampled token frequencies match the tempered / top-k / top-p distribution (Pearson chi-square tests).

Significance: each test fails if the goodness-of-fit p-value is below ALPHA = 1e-3 (with fixed keys the outcome is
deterministic; a correct sampler fails with probability 1e-3 over the choice of key). Each test also checks its
own power: the same counts must reject a plausible wrong distribution (the unfiltered / untempered one).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from scipy import stats

import jaxcap.models as M
from jaxcap.models import rope_index
from jaxcap.processing import ModelInputs
from jaxcap.sampling import Sampler, SamplingConfig, sample_tokens

ALPHA = 1e-3
DRAWS = 20000


def _reference_probs(logits, cfg: SamplingConfig):
  z = np.asarray(logits, np.float64) / cfg.temperature
  order = np.argsort(-z)
  keep = np.zeros(z.shape, bool)
  keep[order[: cfg.top_k or len(z)]] = True
  p = np.exp(z - z.max()) * keep
  p /= p.sum()
  if cfg.top_p < 1:
    ps = p[order]
    keep[order[(np.cumsum(ps) - ps) >= cfg.top_p]] = False
    p = p * keep
    p /= p.sum()
  return p


def _chi_square_p(counts, probs):
  support = probs > 0
  assert counts[~support].sum() == 0, f"sampled outside the support: {np.nonzero(counts * ~support)}"
  return stats.chisquare(counts[support], probs[support] * counts.sum()).pvalue


LOGITS = np.array([2.0, 1.6, 1.1, 0.7, 0.2, -0.4, -1.0, -2.5], np.float32)


@pytest.mark.parametrize(
  "cfg",
  [
    SamplingConfig(temperature=1.0),
    SamplingConfig(temperature=0.6),
    SamplingConfig(temperature=1.3, top_p=0.8),
    SamplingConfig(temperature=2.0, top_k=3),
    SamplingConfig(temperature=0.9, top_k=5, top_p=0.7),
  ],
  ids=lambda c: f"T{c.temperature}_k{c.top_k}_p{c.top_p}",
)
def test_token_frequencies_match_distribution(cfg):
  logits = jnp.broadcast_to(jnp.asarray(LOGITS), (DRAWS, LOGITS.size))
  tokens, sample_lp, _ = sample_tokens(jax.random.key(0), logits, cfg)
  counts = np.bincount(np.asarray(tokens), minlength=LOGITS.size)
  probs = _reference_probs(LOGITS, cfg)
  assert _chi_square_p(counts, probs) > ALPHA
  np.testing.assert_allclose(np.exp(np.asarray(sample_lp)), probs[np.asarray(tokens)], rtol=1e-5)
  wrong = _reference_probs(LOGITS, SamplingConfig(temperature=cfg.temperature * 1.5))  # power check
  assert stats.chisquare(counts, wrong * DRAWS).pvalue < 1e-6


def test_end_to_end_first_token_frequencies():
  """Through prefill + cache repeat: G samples of one prompt on a 32-token vocabulary model."""
  cfg = M.tiny(vocab_size=32)
  model = M.Qwen25VL(cfg, rngs=nnx.Rngs(4))
  ids = np.array([[1, 5, 9, 2, 7, 3]], np.int32)
  mask = np.ones_like(ids, bool)
  positions, deltas = rope_index(cfg, ids, mask)
  prompt = ModelInputs(ids, mask, positions, deltas)
  logits, _ = model(jnp.asarray(ids), jnp.asarray(positions), jnp.asarray(mask))
  logits = np.asarray(logits)[0, -1]
  sampling = SamplingConfig(temperature=float(logits.std()) / 1.5, top_p=0.9, max_new_tokens=1)
  out = Sampler(model, sampling=sampling, length_multiple=8)(prompt, jax.random.key(1), num_samples=DRAWS // 4)
  counts = np.bincount(np.asarray(out.tokens)[:, 0], minlength=32)
  probs = _reference_probs(logits, sampling)
  assert 4 <= (probs > 0).sum() < 32  # the nucleus is a real cut of a non-trivial distribution
  assert _chi_square_p(counts, probs) > ALPHA
  wrong = _reference_probs(logits, SamplingConfig(temperature=sampling.temperature))
  assert stats.chisquare(counts, wrong * counts.sum()).pvalue < 1e-6


def test_categorical_logprob_is_the_log_softmax_of_the_choice():
  """The draw's log-probability comes from its own normaliser; it equals log_softmax at the drawn index, with
  excluded (-inf) candidates and a vocabulary that is not a multiple of the block."""
  from jaxcap.sampling.distribution import categorical_with_logprob

  rng = np.random.default_rng(3)
  logits = jnp.asarray(rng.standard_normal((6, 1000)) * 4, jnp.float32)
  logits = logits.at[:, 500:].set(-jnp.inf).at[0, :].set(-jnp.inf).at[0, 7].set(3.0)
  choice, lp = jax.jit(categorical_with_logprob)(jax.random.key(1), logits)
  expected = jnp.take_along_axis(jax.nn.log_softmax(logits, -1), choice[:, None], -1)[:, 0]
  assert int(choice[0]) == 7 and float(lp[0]) == 0.0
  assert bool(jnp.all(choice < 500))
  np.testing.assert_allclose(np.asarray(lp), np.asarray(expected), atol=1e-5)
