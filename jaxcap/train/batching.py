"""Records -> device batches: chat prompts through the processor, a leading micro-batch axis, and global arrays
sharded over the mesh's batch axes."""

from __future__ import annotations

from typing import Sequence

import jax
import numpy as np
from jax.sharding import NamedSharding

from jaxcap.data.records import ImageRecord
from jaxcap.models.vision import vision_layout
from jaxcap.processing import Processor
from jaxcap.sharding import logical_to_spec
from jaxcap.train import data as data_lib
from jaxcap.train.step import PromptBatch


class Batcher:
  """Turns records into device batches with a leading micro-batch axis, sharded over the batch axes."""

  def __init__(self, processor: Processor, config, mesh):
    self.processor, self.config, self.mesh = processor, config, mesh

  def inputs(self, records: Sequence[ImageRecord]):
    convs = [data_lib.conversation(r, self.config.data.prompt, self.config.data.image_size) for r in records]
    return self.processor(convs, padding_side="left", pad_to_multiple_of=self.config.data.pad_to_multiple)

  def prompts(self, inputs, num_micro: int):
    """ModelInputs of B prompts -> (PromptBatch [M, B/M, ...], shared VisionLayout of one micro-batch)."""
    b = inputs.input_ids.shape[0]
    if b % num_micro:
      raise ValueError(f"batch of {b} prompts does not split into {num_micro} micro-batches")
    mb = b // num_micro
    layout, pixels = None, None
    if inputs.pixel_values is not None:
      grids = inputs.grid_thw
      if not (grids == grids[0]).all():
        raise ValueError("all images of a step must share one size; set data.image_size (pixels) to resize them")
      per_item = int(np.prod(grids[0]))
      pixels = inputs.pixel_values.reshape(num_micro, mb * per_item, -1)
      # The step sees the global micro-batch (every process's images, all of one size).
      layout = vision_layout(np.repeat(grids[:1], mb * jax.process_count(), axis=0), self.processor.cfg.vision)
    split = lambda x: x.reshape(num_micro, mb, *x.shape[1:])
    pos = inputs.positions.reshape(3, num_micro, mb, -1).transpose(1, 0, 2, 3)
    batch = PromptBatch(split(inputs.input_ids), pos, split(inputs.attention_mask), pixels)
    logical = {
      "ids": (None, "batch", None),
      "positions": (None, None, "batch", None),
      "mask": (None, "batch", None),
      # whole images per device when the micro-batch divides the batch axes
      "pixel_values": (None, "batch", None),
    }
    return self.place(batch, logical), layout

  def place(self, tree, logical: dict | None = None):
    """Host arrays -> global device arrays sharded over ('data', 'fsdp') on their batch axis."""

    def put(path, x):
      if x is None:
        return None
      name = str(getattr(path[0], "name", getattr(path[0], "key", ""))) if path else ""
      axes = (logical or {}).get(name, (None, "batch") + (None,) * (np.ndim(x) - 2))
      spec = logical_to_spec(axes[: np.ndim(x)], np.shape(x), self.mesh)
      return jax.make_array_from_process_local_data(NamedSharding(self.mesh, spec), np.asarray(x))

    return jax.tree_util.tree_map_with_path(put, tree)

  def micro(self, x: np.ndarray, num_micro: int):
    """A host array [B*..., ...] -> a device array [M, B/M*..., ...] sharded on its batch axis."""
    x = np.asarray(x)
    return self.place({"x": x.reshape(num_micro, -1, *x.shape[1:])})["x"]


def encode_targets(tokenizer, captions: Sequence[str], length: int, eos_id: int) -> tuple[np.ndarray, np.ndarray]:
  """Target token ids int32 [N, length] (each caption + EOS, truncated) and their mask bool [N, length]."""
  ids = np.zeros((len(captions), length), np.int32)
  mask = np.zeros((len(captions), length), bool)
  for i, c in enumerate(captions):
    t = tokenizer(c, add_special_tokens=False)["input_ids"][: length - 1] + [eos_id]
    ids[i, : len(t)] = t
    mask[i, : len(t)] = True
  return ids, mask
