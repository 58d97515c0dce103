"""The paged rollout engine's programs for `plan` (`rollout.engine='paged'`): its pool of pages, and the abstract
arguments of its prefill (a step's prompts into pages) and decode segment (up to `rollout.segment_steps` steps of
every slot, reading each slot's filled pages only).

The engine is data parallel (`jaxcap.sampling.mesh_shards`): each block of prompts the mesh's batch axes give a
device is one engine's, with the whole model (the params replicated) and its own slots and pool, so its programs
are planned on the target's first device for one block of the step's prompts (rows / shards). With several
blocks, its prefill takes its rows' embeddings (the engine embeds a step's images once, on one device: that
vision-tower program is not planned here). The pool is what a call needs at once with `rollout.pages=0`:
every slot at its worst (its prompt's pages and its own for `sampling.max_new_tokens`: a prompt one token short of
its pages, whose last page each sample copies) plus one step's prompts (`page_budget.pool_pages`). The segment's
decode attention is `rollout.attention`'s for the target's platform (`paged_attention.choose`: on TPU, JAX's Pallas
paged-attention kernel for a bfloat16 cache).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np

from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from jaxcap.models import row_blocks
from jaxcap.sampling import paged_attention
from jaxcap.sampling.decode_layout import unpack
from jaxcap.sampling.generate import compute_dtype_params
from jaxcap.sampling.page_budget import own_pages, pool_pages, state_rows
from jaxcap.sampling.paged_cache import PagePool, recurrent_zeros
from jaxcap.sampling.paged_decode import decode_weights, prefill_jit, segment_jit
from jaxcap.sampling.paged_slots import Outputs, Slots
from jaxcap.sampling.prompts import Prompts
from jaxcap.sharding import logical_to_spec
from jaxcap.train.steps.programs import rollout_engine


@dataclasses.dataclass(frozen=True)
class EnginePlan:
  """One engine's sizes (`shards` engines, one per block of prompts): `slots` decode slots, a pool of `pages` pages
  of `page_size` tokens (`pool_bytes` for every layer's keys and values), `read_pages` pages a slot reads at its
  longest; `attention` the segment's ('reference', 'blocked' on CPU, or the platform's Pallas kernel: 'tpu' /
  'gpu'), `read_bytes` the keys and values a decode step reads with every slot at its longest (all layers; a
  kernel's reads, which XLA's count of the program leaves out); `slots_fit` the slots that would fit the device (`slots_that_fit`; None until planned, or with a fixed `rollout.pages`); `state_bytes` a hybrid decoder's
  linear states (every slot's and the store of prompt states: `page_budget.state_rows`), 0 for attention only."""

  slots: int
  shards: int
  page_size: int
  pages: int
  pool_bytes: int
  read_pages: int
  attention: str
  read_bytes: int
  slots_fit: int | None = None
  state_bytes: int = 0


def slots_that_fit(slots: int, peaks: dict[str, int], more_peaks: dict[str, int], more: int, budget: float) -> int:
  """The most decode slots whose engine programs fit `budget` bytes per device, from each program's compiled peak
  at `slots` (`peaks`, name -> bytes) and at `more` slots (`more_peaks`): linear between the two compiles (each
  slot adds its pages to the pool, its row of the page table, its activations and whatever copies of the pool
  the compiler keeps), so the estimate is the compiler's own. 0 when not even the engine's fixed part fits."""
  fit = []
  for name, peak in peaks.items():
    per_slot = (more_peaks[name] - peak) / (more - slots)
    fit.append(slots + int((budget - peak) // per_slot) if per_slot > 0 else slots if peak <= budget else 0)
  return max(0, min(fit))


def _attention(config, cfg, platform: str) -> paged_attention.DecodeAttention:
  engine = rollout_engine(config)
  return paged_attention.choose(
    engine.attention, platform, cache_dtype=cfg.dtype, page_size=engine.page_size, head_dim=cfg.text.head_dim
  )


def engine_shards(mesh, rows: int) -> int:
  """How many engines a step's `rows` prompts are spread over: the mesh's batch axes that divide them."""
  spec = logical_to_spec(("batch",), (rows,), mesh)[0]
  axes = () if spec is None else (spec,) if isinstance(spec, str) else spec
  return int(np.prod([mesh.shape[a] for a in axes]))


def engine_inputs(
  config,
  cfg,
  params,
  graphdef,
  prompts: Prompts,
  num_samples: int,
  platform: str,
  one=None,
  shards: int = 1,
  slots: int | None = None,
) -> SimpleNamespace:
  """The abstract arguments of one engine's `prefill` and `segment`, on the one-device mesh `one` (default:
  as `params` lie), for its block of one RL step's prompts `prompts` (the sampler's bucketed batch, abstract:
  rows x T, over `shards` engines), and the pool's sizes (`EnginePlan`) on `platform`'s devices. `slots`: the
  engine's decode slots (default `rollout.slots`)."""
  engine = rollout_engine(config)
  engine = engine if slots is None else dataclasses.replace(engine, slots=slots)
  z, new = engine.page_size, int(config.sampling.max_new_tokens)
  embedded = None
  if one is not None:
    place = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(one, PartitionSpec()))
    # as `PagedSampler` passes them: whole on each engine's device, in the compute dtype
    params = jax.tree.map(place, jax.eval_shape(functools.partial(compute_dtype_params, dtype=cfg.dtype), params))
    block = lambda x, axis, n: jax.ShapeDtypeStruct(
      x.shape[:axis] + (x.shape[axis] // n,) + x.shape[axis + 1 :],
      x.dtype,
      sharding=NamedSharding(one, PartitionSpec()),
    )
    embedded = None
    if prompts.vision is not None and shards > 1:  # a chunk's images are embedded once; the prefill takes its rows
      whole = jax.eval_shape(
        lambda p, ids, v: nnx.merge(graphdef, unpack(p)[0]).embed_vision(ids, v), params, prompts.input_ids,
        prompts.vision,
      )  # fmt: skip
      embedded = (block(whole[0], 0, shards), None if whole[1] is None else block(whole[1], 1, shards))
    prompts = Prompts(
      block(prompts.input_ids, 0, shards), block(prompts.attention_mask, 0, shards),
      block(prompts.positions, 1, shards), block(prompts.rope_deltas, 0, shards),
      prompts.vision if embedded is None else None,
    )  # fmt: skip
  rows, t = prompts.input_ids.shape
  t_pages = -(-t // z)
  if t_pages * z != t:  # the engine pads prompts to whole pages
    pad = lambda x, axis: jax.ShapeDtypeStruct(
      x.shape[:axis] + (t_pages * z,) + x.shape[axis + 1 :], x.dtype, sharding=getattr(x, "sharding", None)
    )
    prompts = Prompts(
      pad(prompts.input_ids, 1), pad(prompts.attention_mask, 1), pad(prompts.positions, 2), prompts.rope_deltas,
      prompts.vision,
    )  # fmt: skip
  worst = t_pages * z - (z > 1)  # prompt tokens: t_pages pages, the last partly filled (copied by each sample)
  pages = pool_pages([np.full(rows, worst)], slots=engine.slots, pages=engine.pages, z=z, max_new_tokens=new)
  t_cfg = cfg.text
  dtype = jnp.dtype(cfg.dtype)
  layers = t_cfg.kv_layers
  out_rows, r = rows * num_samples, engine.slots
  # the engine's own buffers (jaxcap.sampling.engine_state builds them so), abstract: its pool (with a hybrid decoder's
  # store of prompt states), outputs and slots (with their states)
  recurrent = bool(recurrent_zeros(cfg, 0))
  stored = state_rows(r, [rows]) if recurrent else 0
  pool = jax.eval_shape(lambda: PagePool.for_model(cfg, pages, z, stored))
  out = jax.eval_shape(lambda: Outputs.empty(out_rows, new, 0))
  slots = jax.eval_shape(lambda: Slots.empty(r, out_rows, recurrent_zeros(cfg, r)))
  i32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)
  read = worst // z + int(own_pages(new, z, worst % z))  # its prompt's full pages and its own
  with jax.set_mesh(one) if one is not None else contextlib.nullcontext():  # the target's layout (row blocks: CPU)
    weights = jax.eval_shape(
      lambda p: decode_weights(p, graphdef=graphdef, rows=r if row_blocks.applies(r) else None), params
    )
  key = jax.eval_shape(lambda: jax.random.key(0))
  pool_bytes = 2 * layers * int(np.prod(pool.k[0].shape)) * dtype.itemsize  # keys and values (linear states apart)
  read_bytes = pool_bytes // pages * r * read  # a page's keys and values in every layer, per slot
  if recurrent:  # the prefill's rows of the store: after its optional arguments
    extra = (i32(), embedded, i32(rows))
  else:
    extra = () if embedded is None else (i32(), embedded)
  return SimpleNamespace(
    prefill=(params, prompts, pool, out, i32(rows, t_pages), i32(), i32(), key) + extra,
    segment=(params, *weights, pool, slots, out, i32(r, read), key, i32()),
    plan=EnginePlan(
      r,
      shards,
      z,
      pages,
      pool_bytes,
      read,
      _attention(config, cfg, platform).kernel,
      read_bytes,
      state_bytes=(r + stored) * t_cfg.recurrent_bytes(dtype),
    ),  # fmt: skip
    steps=engine.segment_steps,
  )


def engine_programs(
  config, cfg, graphdef, sampling, num_samples: int, stop_ids: tuple[int, ...], platform: str
) -> dict:
  """name -> the lowering function of each engine program, with the run's static arguments (the segment's
  attention chosen for `platform`, the target devices')."""
  model = dict(graphdef=graphdef, sampling=sampling, num_samples=num_samples)
  steps = rollout_engine(config).segment_steps
  segment = dict(stop_ids=stop_ids, steps=steps, attention=_attention(config, cfg, platform))
  return {
    "paged_prefill": lambda *args: prefill_jit.lower(*args, **model),
    "segment": lambda *args: segment_jit.lower(*args, **model, **segment),
  }
