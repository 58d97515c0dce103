"""The graph a model runs inference in on XLA:CPU: its layer stacks unrolled.

A `lax.scan` over a layer stack copies the stacked weights into the loop's state, and XLA:CPU computes a 16-bit dot
in float32, so a bf16 model's whole stack is held once more, as float32, for the call (Qwen2.5-VL-3B's 6.99 GiB of
bf16 params peaked at 20.9 GiB in one jitted forward: benchmarks/real_shape_table.py). Unrolled, each layer reads
its slice of the stack as it is and converts it alone (`layers.scan_layers(unroll=True)`). Training keeps the
scans: they compile in a fraction of the time and carry activation checkpointing.
"""

from __future__ import annotations

from flax import nnx

from jaxcap.models import row_blocks


def unrolled_on_cpu(graphdef, params):
  """On XLA:CPU, the graph of a second module over the same `params` (nothing copied; adapters and all) with the
  decoder's and the vision tower's scans unrolled; `graphdef` itself on other backends or when already unrolled."""
  view = nnx.merge(graphdef, params)
  if not view.cfg.scan_layers or not row_blocks.on_cpu():
    return graphdef
  view.cfg, view.visual.unroll = view.cfg.replace(scan_layers=False), True
  return nnx.graphdef(view)
