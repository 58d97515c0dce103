"""The compiled rollout: one prefill per prompt, shared by its G samples, then a `lax.while_loop` decode.

Both stages are pure functions of (params, inputs, key), jitted with the model's graphdef and the sampling config
as static arguments. Row b * G + g of every output is sample g of prompt b.

Cache layout: slots [0, T) hold the left-padded prompt, slot T + k holds the k-th generated token; all shapes are
fixed by (B, T, G, max_new_tokens), so the loop never recompiles and XLA updates the cache in place.
"""

from __future__ import annotations

import collections
import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from jaxcap.models.qwen25vl import KVCache
from jaxcap.sampling.decode_layout import unpack
from jaxcap.sampling.distribution import SamplingConfig, is_stop, sample_tokens
from jaxcap.sampling.loop_program import LoopProgram
from jaxcap.sampling.prompts import Prompts
from jaxcap.sharding import shard

# How many times each stage has been traced (= compiled) in this process; tests assert on it.
TRACE_COUNTS: collections.Counter = collections.Counter()


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecodeState:
  """The decode loop's carry. R = B * G rows, S = T + max_new_tokens cache slots, N = max_new_tokens.

  step: int32 scalar, tokens generated so far (the next one is written at column `step`).
  tokens int32 [R, N] (pad after a stop); sample_logprobs / policy_logprobs float32 [R, N] (0 after a stop);
  lengths int32 [R] tokens emitted including the stop token; done bool [R];
  last_position int32 [R] mRoPE position of the newest token in the cache (all three ids equal);
  slot_mask bool [R, S] cache slots holding real tokens; key: the call's PRNG key.
  """

  cache: KVCache  # or the family's own cache (`model.empty_cache`: Qwen3.5's HybridCache)
  slot_mask: jax.Array
  tokens: jax.Array
  sample_logprobs: jax.Array
  policy_logprobs: jax.Array
  lengths: jax.Array
  done: jax.Array
  last_position: jax.Array
  prompt_length: jax.Array
  step: jax.Array
  key: jax.Array


def _emit(state: DecodeState, logits: jax.Array, sampling: SamplingConfig, stop_ids, pad_id: int) -> DecodeState:
  """Samples column `state.step` from logits [R, V] and advances the per-row bookkeeping."""
  key = jax.random.fold_in(state.key, state.step)
  token, sample_lp, policy_lp = sample_tokens(key, logits, sampling)
  live = ~state.done
  token = jnp.where(live, token, pad_id)
  put = lambda arr, col: jax.lax.dynamic_update_slice_in_dim(arr, col[:, None].astype(arr.dtype), state.step, 1)
  return dataclasses.replace(
    state,
    tokens=put(state.tokens, token),
    sample_logprobs=put(state.sample_logprobs, jnp.where(live, sample_lp, 0.0)),
    policy_logprobs=put(state.policy_logprobs, jnp.where(live, policy_lp, 0.0)),
    lengths=state.lengths + live.astype(jnp.int32),
    done=state.done | (live & is_stop(token, stop_ids)),
    step=state.step + 1,
  )


def prefill(
  params,
  prompts: Prompts,
  key: jax.Array,
  *,
  graphdef,
  sampling: SamplingConfig,
  num_samples: int,
  stop_ids: tuple[int, ...],
  pad_id: int,
) -> DecodeState:
  """Encodes the B prompts' images and runs the prompt once, repeats the cache G times, samples token 0."""
  TRACE_COUNTS["prefill"] += 1
  params, layers = unpack(params)
  model = nnx.merge(graphdef, params)
  b, t = prompts.input_ids.shape
  g, n = num_samples, sampling.max_new_tokens
  x, deepstack = model.embed_vision(prompts.input_ids, prompts.vision)
  mask = prompts.attention_mask.astype(bool)
  hidden, prompt_cache = model.decode(
    x, prompts.positions, mask, model.empty_cache(b, t), 0, layers, deepstack=deepstack
  )
  logits = jnp.repeat(model.logits(hidden[:, -1]), g, axis=0)  # left padding: the last column is real

  cache = prompt_cache.grow(g, n)
  rows = b * g
  real = mask.sum(-1).astype(jnp.int32)
  zeros_f = jnp.zeros((rows, n), jnp.float32)
  state = DecodeState(
    cache=cache,
    slot_mask=shard(jnp.pad(jnp.repeat(mask, g, axis=0), ((0, 0), (0, n))), ("batch", None)),
    tokens=shard(jnp.full((rows, n), pad_id, jnp.int32), ("batch", None)),
    sample_logprobs=zeros_f,
    policy_logprobs=zeros_f,
    lengths=jnp.zeros((rows,), jnp.int32),
    done=jnp.zeros((rows,), bool),
    # the k-th new token sits at max prompt position + 1 + k = real length + rope delta + k
    last_position=jnp.repeat(real + prompts.rope_deltas.astype(jnp.int32), g) - 1,  # = max prompt position
    prompt_length=jnp.asarray(t, jnp.int32),
    step=jnp.asarray(0, jnp.int32),
    key=key,
  )
  return _emit(state, logits, sampling, stop_ids, pad_id)


def decode(
  params, state: DecodeState, *, graphdef, sampling: SamplingConfig, stop_ids: tuple[int, ...], pad_id: int
) -> DecodeState:
  """Feeds the last token and samples the next until every row stopped or max_new_tokens were emitted."""
  TRACE_COUNTS["decode"] += 1
  params, held = unpack(params)
  dtype = nnx.merge(graphdef, params).cfg.dtype
  model = nnx.merge(graphdef, compute_dtype_params(params, dtype))
  rows = state.tokens.shape[0]
  # sliced (cast, laid out for few rows) once, outside the loop; as they are when held so (no second copy)
  layers = model.layer_params(rows) if held is None else compute_dtype_params(held, dtype)
  head = model.head_params(rows)
  n = sampling.max_new_tokens

  def keep_going(s: DecodeState):
    return (s.step < n) & ~jnp.all(s.done)

  def step(s: DecodeState) -> DecodeState:
    slot = s.prompt_length + s.step - 1  # where the last emitted token goes
    last = jax.lax.dynamic_slice_in_dim(s.tokens, s.step - 1, 1, axis=1)  # [R, 1]
    slot_mask = jax.lax.dynamic_update_slice_in_dim(s.slot_mask, jnp.ones_like(last, bool), slot, 1)
    position = s.last_position + 1
    positions = jnp.broadcast_to(position[None, :, None], (3, *last.shape))
    hidden, cache = model.decode(model.embed(last), positions, slot_mask, s.cache, slot, layers=layers)
    s = dataclasses.replace(s, cache=cache, slot_mask=slot_mask, last_position=position)
    return _emit(s, model.logits(hidden[:, 0], head), sampling, stop_ids, pad_id)

  return jax.lax.while_loop(keep_going, step, state)


def compute_dtype_params(params, dtype):
  """`params` with float leaves wider than the compute `dtype` cast to it, once, before the decode loop: each step
  then reads bfloat16 weights from memory instead of float32 masters (decoding is bandwidth-bound), at the cost
  of one bfloat16 copy for the loop's duration. Exact: every matmul casts its weights to `dtype` anyway."""
  dtype = jnp.dtype(dtype)

  def cast(x):
    wider = jnp.issubdtype(x.dtype, jnp.floating) and jnp.dtype(x.dtype).itemsize > dtype.itemsize
    return x.astype(dtype) if wider else x

  return jax.tree.map(cast, params)


def static_arguments(graphdef, sampling: SamplingConfig, eos_token_id: int, pad_id: int) -> dict:
  """The static arguments of `prefill_jit` / `decode_jit`: what the `Sampler` and `jaxcap.plan` pass them."""
  return dict(graphdef=graphdef, sampling=sampling, pad_id=pad_id, stop_ids=sampling.resolve_stop_ids(eos_token_id))


_STATIC = ("graphdef", "sampling", "stop_ids", "pad_id")
prefill_jit = jax.jit(prefill, static_argnames=_STATIC + ("num_samples",))
# The state (cache included) is donated: the loop reuses the prefill's buffers instead of copying them. On CPU
# without hoisting out of the loop (`loop_program`): no float32 copy of the embedding table for the loop.
decode_jit = LoopProgram(decode, static_argnames=_STATIC, donate_argnames=("state",))
