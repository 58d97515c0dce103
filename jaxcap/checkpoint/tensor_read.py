"""Tensors of a safetensors checkpoint read into device arrays: each into a 64-byte-aligned host buffer that XLA:CPU
adopts as the array (zero-copy), in runs of the stored tensor's first axis, so a read holds each weight once; and
`LayerReader`, a stacked decoder leaf left on disk, read a layer at a time (straight into row blocks where the
decode loop wants them).
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from jaxcap.checkpoint.hf_layout import from_hf_layout
from jaxcap.models import row_blocks


def _aligned_empty(shape: tuple, dtype) -> np.ndarray:
  """An uninitialised host buffer whose data starts on a 64-byte boundary. XLA:CPU adopts such a buffer as the device
  array's memory (zero-copy) where numpy's default 16-byte alignment makes it copy, so a leaf read into one is never
  held twice."""
  dtype = np.dtype(dtype)
  nbytes = int(np.prod(shape)) * dtype.itemsize
  raw = np.empty(nbytes + _ALIGN, np.uint8)
  start = -raw.ctypes.data % _ALIGN
  return raw[start : start + nbytes].view(dtype).reshape(shape)


_ALIGN = 64


def _read_into(out: np.ndarray, tensor, layout: str, idx: tuple) -> np.ndarray:
  """Reads the block `idx` (jaxcap layout) of a lazy safetensors slice into `out`, converting its dtype, in runs of
  the stored tensor's first axis of about `_CHUNK` bytes: only one run's read buffer is held beside `out`."""
  if layout == "conv":  # small; read whole
    out[...] = from_hf_layout(tensor[:], layout)[idx]
    return out
  if out.size == 0:
    return out
  axis = 1 if layout == "t" else 0  # the stored first axis in jaxcap's layout
  stored = range(tensor.get_shape()[0])[idx[axis]]
  step = max(1, _CHUNK // max(1, out.nbytes // len(stored)))
  for start in range(0, len(stored), step):
    run = slice(stored[start], stored[min(start + step, len(stored)) - 1] + 1)
    if layout == "t":  # XLA transposes (and converts) a run ~6x faster than numpy's strided copy of a 2-byte dtype
      out[:, start : start + step] = np.asarray(_transposed(np.asarray(tensor[run, idx[0]]), out.dtype))
    else:
      out[start : start + step] = np.asarray(tensor[(run,) + tuple(idx[1:])])
  return out


_CHUNK = 64 * 2**20
_transposed = jax.jit(lambda x, dtype: x.T.astype(dtype), static_argnums=1)


def _full(idx, ndim: int) -> tuple:
  return tuple(idx) + (slice(None),) * (ndim - len(idx))


def _block_shape(idx: tuple, shape) -> tuple:
  return tuple(len(range(n)[i]) for i, n in zip(idx, shape))


def place(tensor, layout: str, shape, dtype, sharding) -> jax.Array:
  """A device array holding `tensor` (lazy safetensors slice) in jaxcap layout, each shard read separately."""

  def read(idx):
    idx = _full(idx, len(shape))
    return _read_into(_aligned_empty(_block_shape(idx, shape), dtype), tensor, layout, idx)

  return jax.make_array_from_callback(tuple(shape), sharding, read)


class LayerReader:
  """A stacked [L, ...] leaf left on disk (`load_hf_checkpoint(layers_apart=True)`; an untied LM head as a stack of
  one, `stacked=False`): `layer(i)` reads layer i into a device array of its own, the leaf's sharding less the
  layer axis."""

  def __init__(self, tensors: list, layout: str, shape, dtype, sharding, stacked: bool = True):
    shape = tuple(shape) if stacked else (1, *shape)
    self.tensors, self.layout, self.shape, self.dtype = tensors, layout, shape, np.dtype(dtype)
    if isinstance(sharding, NamedSharding) and stacked:
      sharding = NamedSharding(sharding.mesh, PartitionSpec(*sharding.spec[1:]))
    self.sharding = sharding

  @property
  def ndim(self) -> int:
    return len(self.shape)

  def layer(self, i: int) -> jax.Array:
    return place(self.tensors[i], self.layout, self.shape[1:], self.dtype, self.sharding)

  def blocks(self, i: int) -> jax.Array:
    """Layer i of a linear kernel (jaxcap [in, out], stored [out, in]) as row blocks [C, out / C, in]: the stored
    tensor read as it is and reshaped (`row_blocks.from_rows`), where laying out the jaxcap kernel would transpose
    it twice. One device (row blocks are for CPU decoding)."""
    if self.layout != "t":
      return jax.jit(row_blocks.from_kernel)(self.layer(i))
    rows, width = self.tensors[i].get_shape()
    out = _read_into(_aligned_empty((rows, width), self.dtype), self.tensors[i], "same", (slice(None), slice(None)))
    count = row_blocks.block_count(rows)
    return jax.device_put(out.reshape(count, rows // count, width), self.sharding)

  def delete(self) -> None:  # as a jax.Array's: nothing is held
    pass


def layer_axis_whole(sharding) -> bool:
  return not isinstance(sharding, NamedSharding) or not sharding.spec or sharding.spec[0] is None


def place_stacked(tensors: list, layout: str, shape, dtype, sharding) -> jax.Array:
  """A stacked [L, ...] device array from L per-layer tensors; each device reads only its block of each layer,
  layer by layer into one aligned buffer (peak: the block plus one layer's read)."""

  def read(idx):
    idx = _full(idx, len(shape))
    out = _aligned_empty(_block_shape(idx, shape), dtype)
    for row, layer in enumerate(range(len(tensors))[idx[0]]):
      _read_into(out[row], tensors[layer], layout, idx[1:])
    return out

  return jax.make_array_from_callback(tuple(shape), sharding, read)
