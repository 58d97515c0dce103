"""The paged engine over a mesh on a stream of chunks (partial rollouts, `jaxcap.sampling.chunk_feed`): as
`mesh_shards.generate` spreads a call's prompts, each device runs one `scheduler.shard` over its block of every
chunk, through a `DeviceFeed` of the stream's feed; a chunk goes back to the feed once every device has finished
its block, its rows assembled into global arrays as a call's are.

    run = stream(feed, key, mesh=mesh, graphdef=..., cfg=..., engine=..., sampling=..., num_samples=G, pad_id=...)
    next(run)   # every live device's next segment; the feed's `finished` sees each chunk as it completes

Every device's engine runs with the version of the stream's oldest unfinished chunk, and takes a chunk in only
once the chunk two before it has finished on every device (a device ahead of the others waits): where a version
starts then depends on the devices' progress in the driver's fixed round-robin order, never on the timing. A
chunk's images are embedded once, on the first device to prefill it, with the weights of the version the chunk
before it runs with (`feed.weights(c - 1)`: what the feed's rule gives whichever device gets there first); its
rows then go to each device. One process: several processes' feeds would have to agree on every chunk's rows.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from jaxcap.sampling.decode_layout import unpack
from jaxcap.sampling.mesh_shards import _embed, on, on_device, spread
from jaxcap.sampling.placement import SamplerBatch
from jaxcap.sampling.prompts import Prompts, pad_length
from jaxcap.sampling.rollouts import SampledArrays
from jaxcap.sampling.scheduler import shard


class _Chunks:
  """The stream's chunks, each padded to whole pages once, and each one's embeddings until every device took its
  rows."""

  def __init__(self, feed, page_size: int, pad_id: int, graphdef, bounds: list[tuple[int, int]], runners: list):
    self.feed, self.z, self.pad_id, self.graphdef = feed, page_size, pad_id, graphdef
    self.bounds, self.runners = bounds, runners
    self.padded: dict[int, tuple] = {}
    self.embedded: dict[int, list] = {}
    self.taken: dict[int, int] = {}  # devices that fetched the chunk (it is dropped once all have, and embedded)

  def get(self, c: int):
    if c not in self.padded:
      chunk = self.feed.chunk(c)
      self.padded[c] = (chunk, pad_length(chunk.prompts, -(-chunk.prompts.length // self.z) * self.z, self.pad_id))
    return self.padded[c]

  def part(self, c: int, k: int) -> SamplerBatch:
    chunk, p = self.get(c)
    lo, hi = self.bounds[k]
    self.taken[c] = self.taken.get(c, 0) + 1
    if self.taken[c] == len(self.bounds) and chunk.prompts.vision is None:
      del self.padded[c], self.taken[c]
    prompts = Prompts(p.input_ids[lo:hi], p.attention_mask[lo:hi], p.positions[:, lo:hi], p.rope_deltas[lo:hi])
    return SamplerBatch(prompts, int(np.clip(chunk.rows - lo, 0, hi - lo)), hi - lo)

  def embed(self, c: int, k: int):
    chunk, p = self.get(c)
    if chunk.prompts.vision is None:
      return None
    if c not in self.embedded:
      params, _ = self.feed.weights(max(c - 1, 0))
      weights = on_device(params, self.runners[k])
      x, deep = _embed(unpack(weights)[0], jnp.asarray(p.input_ids), jax.tree.map(jnp.asarray, p.vision), self.graphdef)
      self.embedded[c] = [(x[lo:hi], None if deep is None else deep[:, lo:hi]) for lo, hi in self.bounds]
    mine, self.embedded[c][k] = self.embedded[c][k], None
    if all(e is None for e in self.embedded[c]):
      del self.embedded[c]
      self.padded.pop(c, None)
      self.taken.pop(c, None)
    return jax.device_put(mine, self.runners[k])


class DeviceFeed:
  """Device k's view of a stream's feed: its block [lo, hi) of every chunk, the feed's weights on its device, its
  finished blocks handed to `gather`."""

  def __init__(self, feed, chunks: _Chunks, k: int, gather, oldest):
    self.feed, self.chunks, self.k, self.gather, self.oldest = feed, chunks, k, gather, oldest
    lo, hi = chunks.bounds[k]
    self.blocks = [hi - lo] * len(feed.blocks)
    self.ring, self.ahead = 2 * (hi - lo), feed.ahead
    self._weights: dict[int, object] = {}

  def available(self) -> list:
    return [self.chunks.part(0, self.k)] if self.feed.available() else []

  def chunk(self, c: int) -> SamplerBatch:
    return self.chunks.part(c, self.k)

  def weights(self, oldest: int):
    params, version = self.feed.weights(min(self.oldest(), len(self.blocks) - 1))  # the stream's oldest, not ours
    if version not in self._weights:  # this device's copy (a replicated version's own shard: no copy)
      self._weights = {version: on_device(params, self.chunks.runners[self.k])}
    return self._weights[version], version

  def finished(self, c: int, arrays: SampledArrays, versions: np.ndarray) -> None:
    self.gather(c, self.k, arrays, versions)


def stream(feed, key: jax.Array, *, mesh, graphdef, cfg, engine, sampling, num_samples: int, pad_id: int, **kw):
  """A generator driving one `scheduler.shard` per device of `mesh` over `feed` (see the module docstring); each
  step runs every live device's next segment. `kw`: `max_lengths` (over every chunk's rows), `on_group`."""
  if jax.process_count() > 1:
    raise ValueError("the engine over a stream of chunks runs on one process")
  g, block, count = num_samples, int(feed.blocks[0]), len(feed.blocks)
  plan = spread(mesh, [block])
  _, ranges = plan.bounds(block, mesh)
  chunks = _Chunks(feed, engine.page_size, pad_id, graphdef, ranges, plan.runners)
  parts: dict[int, dict] = {}
  done: set[int] = set()

  def oldest() -> int:  # the oldest chunk some device has not finished its block of: every engine's versions follow it
    return next((c for c in range(count) if c not in done), count)

  def gather(c: int, k: int, arrays: SampledArrays, versions: np.ndarray) -> None:
    parts.setdefault(c, {})[k] = (arrays, versions)
    if len(parts[c]) == len(ranges):
      mine = parts.pop(c)
      done.add(c)
      feed.finished(c, _assembled([mine[k][0] for k in range(len(ranges))], plan, mesh, block * g), np.concatenate(
        [mine[k][1] for k in range(len(ranges))]
      ))  # fmt: skip

  max_lengths, on_group = kw.pop("max_lengths", None), kw.pop("on_group", None)
  runs = []
  for k, (lo, hi) in enumerate(ranges):
    prompts = np.concatenate([c * block + np.arange(lo, hi) for c in range(count)])
    rows = np.concatenate([np.arange((c * block + lo) * g, (c * block + hi) * g) for c in range(count)])
    device_feed = DeviceFeed(feed, chunks, k, gather, oldest)
    embed = lambda c, k=k: chunks.embed(c, k)
    limits = None if max_lengths is None else np.asarray(max_lengths)[rows]
    runs.append(
      shard(
        None, None, on_device(key, plan.runners[k]), graphdef=graphdef, cfg=cfg, engine=engine, sampling=sampling,
        num_samples=g, pad_id=pad_id, numbers=prompts, groups=prompts, embed=embed, max_lengths=limits,
        on_group=on_group, feed=device_feed, **kw,
      )
    )  # fmt: skip
  live = list(range(len(runs)))
  while live:
    for k in list(live):
      with on(plan.runners[k]):
        try:
          next(runs[k])
        except StopIteration:
          live.remove(k)
    yield


def _assembled(pieces: list[SampledArrays], plan, mesh, rows: int) -> SampledArrays:
  """One chunk's global arrays from each device's rows of it (device k's: its block's, in order)."""
  fields = []
  for name in SampledArrays.__dataclass_fields__:
    held = {}
    for k, piece in enumerate(pieces):
      held.update({d: jax.device_put(getattr(piece, name), d) for d in plan.holders[k]})
    x = getattr(pieces[0], name)
    sharding = NamedSharding(mesh, PartitionSpec(plan.spec[0], *(None,) * (x.ndim - 1)))
    order = sharding.addressable_devices_indices_map((rows, *x.shape[1:]))
    fields.append(jax.make_array_from_single_device_arrays((rows, *x.shape[1:]), sharding, [held[d] for d in order]))
  return SampledArrays(*fields)
