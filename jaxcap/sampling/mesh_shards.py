"""The paged engine over a mesh and over processes: data parallelism, one engine shard (`scheduler.shard`: its own
slots, page pool, page allocator and queue) per block of prompts the mesh gives a device.

How prompts are spread: as the static sampler spreads its batch. With P processes of B prompts each (a chunk's
global batch of P x B, process blocks in process order), prompt rows are sharded over the mesh's batch axes
(`jaxcap.sharding.LOGICAL_RULES['batch']`: 'data' x 'fsdp'; an axis that does not divide the batch is dropped, as
for any array), so each device holds a contiguous block of prompts and all G samples of each: a prompt's samples
share its prompt pages on one device. Devices holding the same block (the 'tensor' axis, dropped axes) form one
shard: it runs on the first of them, the others get a copy of its outputs. A process runs the shards of its own
devices over its own prompts (the block of the global batch its devices hold); nothing crosses processes but the
weights' replication. The outputs are global arrays laid out as the static sampler's (`SampledArrays`: rows
prompt-major, batch-sharded), so the trainer consumes them unchanged.

Weights: every shard runs the whole model on its device (the params replicated once per call: an all-gather of
their mesh layout; the static sampler keeps them sharded). A chunk with images is embedded once
(`embed_vision`, its whole vision pack) on the device of the first shard to prefill it, and each shard's rows of
the embeddings are copied to its device. Each shard's programs run under a one-device mesh of its device.

Random streams: sample g of prompt p (numbered in the call's global batch, `scheduler.shard`'s `numbers`) draws
from (key, p, g, position), as on one device: a sample's tokens are the one-device engine's wherever its logits
are bitwise equal.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from jaxcap.sampling.decode_layout import unpack
from jaxcap.sampling.placement import SamplerBatch
from jaxcap.sampling.prompts import Prompts, pad_length
from jaxcap.sampling.rollouts import SampledArrays
from jaxcap.sampling.scheduler import shard
from jaxcap.sharding import logical_to_spec, make_mesh


@dataclasses.dataclass(frozen=True)
class Spread:
  """Where a call's prompts go. runners[k]: shard k's device; holders[k]: every device of this process holding
  its block (its runner first); spec: the prompt axis' mesh axes."""

  runners: list
  holders: list[list]
  spec: PartitionSpec

  def bounds(self, block: int, mesh) -> tuple[int, list[tuple[int, int]]]:
    """(this process's first prompt in a chunk's global batch of block x P prompts, each shard's [lo, hi) rows of
    its own block of `block`)."""
    index = NamedSharding(mesh, self.spec).addressable_devices_indices_map((block * jax.process_count(),))
    ranges = [index[d][0].indices(block * jax.process_count())[:2] for d in self.runners]
    first = min(lo for lo, _ in ranges)
    if max(hi for _, hi in ranges) - first != block:
      raise ValueError(f"this process's devices hold prompts {sorted(ranges)}, not one block of {block}")
    return first, [(lo - first, hi - first) for lo, hi in ranges]


def spread(mesh, blocks: Sequence[int]) -> Spread:
  """The shards of this process's devices for chunks of `blocks` prompts each (per process): the batch axes that
  divide every chunk's global batch (their gcd), each distinct block of prompts one shard."""
  unit = math.gcd(*blocks) * jax.process_count()
  spec = logical_to_spec(("batch",), (unit,), mesh)
  index = NamedSharding(mesh, spec).addressable_devices_indices_map((unit,))
  groups: dict = collections.defaultdict(list)
  for device in mesh.devices.flat:  # mesh order: the first holder of a block runs it
    if device in index:
      groups[index[device][0].indices(unit)[:2]].append(device)
  order = sorted(groups)
  return Spread([groups[r][0] for r in order], [groups[r] for r in order], spec)


def on_device(tree, device):
  """The tree's leaves on `device`: a replicated leaf's own copy there (no copy made), others copied there."""

  def one(a):
    if isinstance(a, jax.Array) and a.is_fully_replicated and device in a.sharding.device_set:
      return next(s.data for s in a.addressable_shards if s.device == device)
    return jax.device_put(a, device)

  return jax.tree.map(one, tree)


def replicated(params, mesh):
  """`params` whole on every device: global arrays split over processes are all-gathered over `mesh` (every
  process calls this together); arrays a process holds in full are copied to its devices by `on_device`."""
  split = [a for a in jax.tree.leaves(params) if isinstance(a, jax.Array) and not a.is_fully_addressable]
  return jax.device_put(params, NamedSharding(mesh, PartitionSpec())) if split else params


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _embed(params, input_ids, vision, graphdef):
  return nnx.merge(graphdef, params).embed_vision(input_ids, vision)


def generate(
  params, chunks: Sequence[SamplerBatch], key: jax.Array, *, mesh, graphdef, cfg, engine, num_samples: int, **kw
) -> tuple[list[SampledArrays], list[int]]:
  """The engine over `mesh` (`scheduler.shard`'s keywords): (each chunk's global `SampledArrays`, this process's
  first prompt in each chunk's global batch). Chunks are host `SamplerBatch`es of this process's prompts. `stats`
  are summed over this process's engines (host_s: their scheduling time, summed)."""
  g, z = num_samples, engine.page_size
  plan = spread(mesh, [c.block for c in chunks])
  n = len(plan.runners)
  bounds = [plan.bounds(c.block, mesh) for c in chunks]
  params = replicated(params, mesh)
  weights = [on_device(params, d) for d in plan.runners]
  padded = [pad_length(c.prompts, -(-c.prompts.length // z) * z, kw["pad_id"]) for c in chunks]
  local = np.cumsum([0] + [c.block for c in chunks])
  globl = np.cumsum([0] + [c.block * jax.process_count() for c in chunks])
  embedded: dict[int, list] = {}  # chunk -> each shard's rows of its embeddings, until taken

  def embed_for(k: int):
    def embed(c: int):
      if chunks[c].prompts.vision is None:
        return None
      if c not in embedded:  # on the device of the first shard to need it (its context), with its weights
        p = padded[c]
        x, deep = _embed(unpack(weights[k])[0], jnp.asarray(p.input_ids), jax.tree.map(jnp.asarray, p.vision), graphdef)
        rows = [slice(*r) for r in bounds[c][1]]
        embedded[c] = [(x[r], None if deep is None else deep[:, r]) for r in rows]
      mine, embedded[c][k] = embedded[c][k], None
      if all(e is None for e in embedded[c]):
        del embedded[c]
      return jax.device_put(mine, plan.runners[k])

    return embed

  runs, stats = [], kw.pop("stats", None)
  max_lengths, shard_stats = kw.pop("max_lengths", None), [{} for _ in range(n)]
  for k, device in enumerate(plan.runners):
    parts, numbers, groups, rows = [], [], [], []
    for c, chunk in enumerate(chunks):
      first, ranges = bounds[c]
      lo, hi = ranges[k]
      p = padded[c]
      part = Prompts(p.input_ids[lo:hi], p.attention_mask[lo:hi], p.positions[:, lo:hi], p.rope_deltas[lo:hi])
      parts.append(SamplerBatch(part, int(np.clip(chunk.rows - lo, 0, hi - lo)), hi - lo))
      numbers.append(globl[c] + first + np.arange(lo, hi))
      groups.append(local[c] + np.arange(lo, hi))
      rows.append(np.arange((local[c] + lo) * g, (local[c] + hi) * g))
    limits = None if max_lengths is None else np.asarray(max_lengths)[np.concatenate(rows)]
    runs.append(
      shard(
        weights[k], parts, on_device(key, device), graphdef=graphdef, cfg=cfg, engine=engine,
        num_samples=g, numbers=np.concatenate(numbers), groups=np.concatenate(groups), embed=embed_for(k),
        max_lengths=limits, stats=shard_stats[k] if stats is not None else None, **kw,
      )
    )  # fmt: skip
  outs = drive(runs, plan.runners)
  if stats is not None:
    stats.update(_merged(shard_stats))
  return _assemble(outs, chunks, bounds, plan, mesh, g), [first for first, _ in bounds]


def drive(runs: list, devices: list) -> list:
  """Runs the shards' generators in turn, each on its device, until all have returned; their return values. A
  shard resumes (collects its last segment, refills, dispatches its next) while the others' segments run."""
  results, live = [None] * len(runs), list(range(len(runs)))
  while live:
    for k in list(live):
      with on(devices[k]):
        try:
          next(runs[k])
        except StopIteration as done:
          results[k] = done.value
          live.remove(k)
  return results


@contextlib.contextmanager
def on(device):
  """Programs dispatched in here run on `device` alone: its default device and a one-device mesh of it."""
  with jax.default_device(device), jax.set_mesh(make_mesh({"data": 1}, devices=[device])):
    yield


def _merged(stats: list[dict]) -> dict:
  out = {}
  for s in stats:
    for name, value in s.items():
      out[name] = value if name == "traces" else out.get(name, 0) + value
  return out


def _assemble(outs: list[SampledArrays], chunks, bounds, plan: Spread, mesh, g: int) -> list[SampledArrays]:
  """Each chunk's global arrays from the shards' rows (a shard's outputs: its rows of every chunk, in order)."""
  result, start = [], [0] * len(outs)
  for c, chunk in enumerate(chunks):
    _, ranges = bounds[c]
    fields = []
    for f in dataclasses.fields(SampledArrays):
      pieces = {}
      for k, (lo, hi) in enumerate(ranges):
        with on(plan.runners[k]):
          mine = getattr(outs[k], f.name)[start[k] : start[k] + (hi - lo) * g]
        pieces.update({d: jax.device_put(mine, d) for d in plan.holders[k]})
      x = getattr(outs[0], f.name)
      shape = (chunk.block * jax.process_count() * g, *x.shape[1:])
      sharding = NamedSharding(mesh, PartitionSpec(plan.spec[0], *(None,) * (x.ndim - 1)))
      order = sharding.addressable_devices_indices_map(shape)
      fields.append(jax.make_array_from_single_device_arrays(shape, sharding, [pieces[d] for d in order]))
    result.append(SampledArrays(*fields))
    start = [s + (hi - lo) * g for s, (lo, hi) in zip(start, ranges)]
  return result
