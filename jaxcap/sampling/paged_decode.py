"""The paged engine's decode programs: prefill a chunk of prompts into pages, a decode segment of up to K steps, and
the decoder weights a segment reads (laid out once per call and row layout, not per segment). Admission and
compaction of slots are `jaxcap.sampling.paged_slots`; the host scheduler (`jaxcap.sampling.scheduler`) decides
what each does.

Shapes: R decode slots, n pages a slot reads (the live bucket), Z tokens per page, O output rows (every prompt's G
samples, prompt-major: row p * G + g is sample g of prompt p), N = max_new_tokens.

Every random number of sample g of prompt p at token k comes from `sample_key(key, p, g, k)`, never from its slot
or the step of the loop, so what a sample draws does not depend on the slot count, page size, segment length or
which other samples share its batch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxcap.models import row_blocks
from jaxcap.models.decoder import ATTENTION
from jaxcap.sampling.decode_layout import unpack
from jaxcap.sampling.distribution import SamplingConfig, is_stop, sample_tokens
from jaxcap.sampling.generate import compute_dtype_params
from jaxcap.sampling.loop_program import LoopProgram
from jaxcap.sampling.paged_attention import DecodeAttention
from jaxcap.sampling.paged_cache import NULL_PAGE, PagedLayer, PagePool, write_prompt_pages, write_prompt_states
from jaxcap.sampling.paged_slots import TRACE_COUNTS, Outputs, Slots
from jaxcap.sampling.prompts import Prompts


def sample_key(key: jax.Array, prompt: jax.Array, sample: jax.Array, position: jax.Array) -> jax.Array:
  """The key of sample `sample` of prompt `prompt` at token `position` (scalars; vmap for rows)."""
  return jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(key, prompt), sample), position)


def sample_uniforms(key: jax.Array, rows: jax.Array, position: jax.Array, num_samples: int) -> jax.Array:
  """float32 [R] in [0, 1): each output row's uniform at `position` [R] (rows int32 [R], row = p * G + g)."""
  draw = lambda r, k: jax.random.uniform(sample_key(key, r // num_samples, r % num_samples, k), ())
  return jax.vmap(draw)(rows, position)


def _draw(key, logits, rows, position, sampling: SamplingConfig, num_samples: int):
  """Each row's token and log-probs; rows int32 [R]: the rows its draws are keyed by (`sample_uniforms`)."""
  uniform = None if sampling.greedy else sample_uniforms(key, rows, position, num_samples)
  return sample_tokens(None, logits, sampling, uniform=uniform)


def _put(out: Outputs, rows, column, token, sample_lp, policy_lp) -> Outputs:
  """Writes each row's token at (rows[r], column[r]); rows out of range are dropped."""
  put = lambda a, x: a.at[rows, column].set(x.astype(a.dtype), mode="drop")
  return Outputs(
    put(out.tokens, token),
    put(out.sample_logprobs, sample_lp),
    put(out.policy_logprobs, policy_lp),
    out.lengths.at[rows].set(column + 1, mode="drop"),
  )


def prefill(
  params,
  prompts: Prompts,
  pool: PagePool,
  out: Outputs,
  page_ids,
  first_row,
  real,
  key,
  key_first=None,
  embedded=None,
  state_ids=None,
  *,
  graphdef,
  sampling,
  num_samples,
):
  """Runs B prompts (left-padded, T a multiple of the page size) once, writes their keys and values into the
  pages `page_ids` int32 [B, T / Z] names (left-aligned: `write_prompt_pages`), and samples token 0 of each of
  their G samples into output rows (first_row + b) * G + g (int32 scalar first_row) for the `real` (int32 scalar)
  first prompts, drawing as rows (key_first + b) * G + g (int32 scalar; None: first_row). `embedded` (optional):
  the prompts' `embed_vision` (x [B, T, D], DeepStack [n, B, T, D] or None), computed elsewhere (`mesh_shards`:
  a chunk's images embedded once, its rows spread over devices); then `prompts.vision` is not read. `state_ids`
  int32 [B] (a model with recurrent layers): the rows of the pool's prompt states that take each prompt's final
  states (past the store: none, a padded prompt)."""
  TRACE_COUNTS["prefill"] += 1
  params, layers = unpack(params)
  model = nnx.merge(graphdef, params)
  b, t = prompts.input_ids.shape
  g = num_samples
  x, deepstack = model.embed_vision(prompts.input_ids, prompts.vision) if embedded is None else embedded
  mask = prompts.attention_mask.astype(bool)
  hidden, cache = model.decode(x, prompts.positions, mask, model.empty_cache(b, t), 0, layers, deepstack=deepstack)
  kv, states = model.cache_parts(cache)
  pool = write_prompt_pages(pool, kv.k, kv.v, page_ids, jnp.sum(mask, -1, dtype=jnp.int32))
  if states:
    pool = write_prompt_states(pool, states, state_ids)
  logits = jnp.repeat(model.logits(hidden[:, -1]), g, axis=0)  # left padding: the last column is real
  rows = first_row * g + jnp.arange(b * g, dtype=jnp.int32)
  key_rows = rows if key_first is None else key_first * g + jnp.arange(b * g, dtype=jnp.int32)
  zero = jnp.zeros((b * g,), jnp.int32)
  token, sample_lp, policy_lp = _draw(key, logits, key_rows, zero, sampling, g)
  rows = jnp.where(jnp.arange(b * g) < real * g, rows, out.lengths.shape[0])
  return pool, _put(out, rows, zero, token, sample_lp, policy_lp)


def decode_weights(params, *, graphdef, rows):
  """The decoder's per-layer weights and LM head as a decode loop of `rows` rows reads them (compute dtype, row
  blocks where they apply: `Qwen25VL.layer_params` / `head_params`)."""
  TRACE_COUNTS["decode_weights"] += 1
  model = nnx.merge(graphdef, compute_dtype_params(params, nnx.merge(graphdef, params).cfg.dtype))
  return model.layer_params(rows), model.head_params(rows)


class SegmentWeights:
  """The (layers, head) every segment of one call reads. Params a sampler holds as the decode loop reads them
  (`decode_layout.DecodeWeights`) are passed as they are (head None: the segment takes it from the params); plain
  params are laid out by `decode_weights` once per row layout (row blocks or not) and reused by every segment: on
  CPU the layout is a copy of the decoder's weights, too dear to make per segment."""

  def __init__(self, params, graphdef):
    self.params, self.graphdef, self.made = params, graphdef, {}

  def for_rows(self, rows: int):
    _, held = unpack(self.params)
    if held is not None:
      return held, None
    blocked = row_blocks.applies(rows)
    if blocked not in self.made:
      self.made[blocked] = decode_weights_jit(self.params, graphdef=self.graphdef, rows=rows if blocked else None)
    return self.made[blocked]


def segment(
  params,
  layers,
  head,
  pool: PagePool,
  slots: Slots,
  out: Outputs,
  table,
  key,
  stop_live,
  *,
  graphdef,
  sampling,
  stop_ids,
  num_samples,
  steps,
  attention: DecodeAttention = DecodeAttention(),
):
  """Up to `steps` decode steps of every live slot, returning early once at most `stop_live` (int32 scalar) slots
  are live. layers / head: `decode_weights(params, rows=R)`. table int32 [R, n]: each slot's pages (`NULL_PAGE`
  past its own); a step attends over positions [0, length] of them (the new token's included) through
  `attention` (`paged_attention.choose`: the jnp reference over the n * Z positions, or a Pallas kernel reading
  the filled pages only). Layers are called per kind (`model.layer_graphs`): attention layers through their view
  of the pool (`PagedLayer`), recurrent layers on the slots' states, which only live slots advance. Returns the
  pool, slots and outputs, and the steps run (int32 scalar)."""
  TRACE_COUNTS["segment"] += 1
  params, _ = unpack(params)
  dtype = nnx.merge(graphdef, params).cfg.dtype
  model = nnx.merge(graphdef, compute_dtype_params(params, dtype))
  rows = slots.row.shape[0]
  # held weights arrive in their own dtype: cast in the program, each layer converted as its step runs (in_step)
  layers = compute_dtype_params(layers, dtype)
  head = model.head_params(rows) if head is None else head
  layer_graphs = model.layer_graphs()
  z = pool.page_size
  out_rows = out.lengths.shape[0]

  def keep_going(carry):
    i, _, s, _ = carry
    return (i < steps) & (jnp.sum(~s.done) > stop_live)

  def step(carry):
    i, pool, s, out = carry
    live = ~s.done
    position = s.position + 1
    # a decoded token's three mRoPE components are equal, so the band layout changes nothing; passed for clarity
    cos, sin = model.rope(jnp.broadcast_to(position[None, :, None], (3, rows, 1)))
    page = jnp.take_along_axis(table, (s.length // z)[:, None], axis=1)[:, 0]
    write_page = jnp.where(live, page, NULL_PAGE)
    offset = s.length % z
    x = model.embed(s.token[:, None])
    ks, vs, states = [], [], []
    real = jnp.ones((rows, 1), bool)
    keep = lambda new, old: jnp.where(live.reshape(-1, *([1] * (old.ndim - 1))), new.astype(old.dtype), old)
    for (kind, graph), p in zip(layer_graphs, layers):
      x, p = jax.lax.optimization_barrier((x, p))  # as `Qwen25VL.decode`: no hoisted all-gathers
      p = row_blocks.in_step(p, x)
      if kind == ATTENTION:
        li = len(ks)
        view = PagedLayer(pool.k[li], pool.v[li], table, s.length + 1, write_page, offset, attention)
        x, view = nnx.merge(graph, p)(x, cos, sin, None, view, None)
        ks.append(view.k)
        vs.append(view.v)
      else:  # a recurrent layer: one step of each slot's state; finished and empty slots keep theirs
        old = s.states[len(states)]
        x, new = nnx.merge(graph, p)(x, real, old)
        states.append(jax.tree.map(keep, new, old))
    logits = model.logits(model.norm(x)[:, 0], head)
    token, sample_lp, policy_lp = _draw(key, logits, s.key_row, s.emitted, sampling, num_samples)
    out = _put(out, jnp.where(live, s.row, out_rows), s.emitted, token, sample_lp, policy_lp)
    emitted = s.emitted + live
    s = Slots(
      row=s.row,
      key_row=s.key_row,
      done=s.done | (live & (is_stop(token, stop_ids) | (emitted >= s.limit))),
      token=jnp.where(live, token, s.token),
      emitted=emitted,
      limit=s.limit,
      length=s.length + live,
      position=jnp.where(live, position, s.position),
      states=tuple(states),
    )
    return i + 1, PagePool(tuple(ks), tuple(vs), pool.states), s, out

  steps_run, pool, slots, out = jax.lax.while_loop(keep_going, step, (jnp.int32(0), pool, slots, out))
  return pool, slots, out, steps_run


_MODEL = ("graphdef", "sampling", "num_samples")
decode_weights_jit = jax.jit(decode_weights, static_argnames=("graphdef", "rows"))
prefill_jit = jax.jit(prefill, static_argnames=_MODEL, donate_argnames=("pool", "out"))
# on CPU without hoisting out of the loop (`loop_program`): no float32 copy of the embedding table for the loop
segment_jit = LoopProgram(
  segment, static_argnames=_MODEL + ("stop_ids", "steps", "attention"), donate_argnames=("pool", "slots", "out")
)
