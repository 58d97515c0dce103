"""Rollouts: batched caption sampling with a static-shape KV cache (prefill once per image, G samples each), or the
paged engine (decode slots refilled as samples finish, a paged KV cache)."""

from jaxcap.sampling.distribution import SamplingConfig, categorical, filtered_logits, sample_tokens
from jaxcap.sampling.generate import TRACE_COUNTS, DecodeState, decode, prefill
from jaxcap.sampling.prompts import Prompts, batch_bucket, bucket_prompts
from jaxcap.sampling.rollouts import Rollouts
from jaxcap.sampling.sampler import Sampler
from jaxcap.sampling.engine import EngineConfig, PagedSampler
