"""The graph a model samples in: the same params (adapters and all) through a second module with settings only
training needs switched off.

On XLA:CPU its layer stacks are unrolled (`unrolled_on_cpu`).
A `lax.scan` over a layer stack copies the stacked weights into the loop's state, and XLA:CPU computes a 16-bit dot
in float32, so a bf16 model's whole stack is held once more, as float32, for the call (Qwen2.5-VL-3B's 6.99 GiB of
bf16 params peaked at 20.9 GiB in one jitted forward: benchmarks/real_shape_table.py). Unrolled, each layer reads
its slice of the stack as it is and converts it alone (`layers.scan_layers(unroll=True)`). Training keeps the
scans: they compile in a fraction of the time and carry activation checkpointing.

Activation checkpointing is off (`without_remat`): sampling has no backward pass, and `nnx.remat` inside the decode
loop cannot trace.
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


def without_remat(graphdef, params):
  """The graph of a second module over the same `params` with every module's activation checkpointing off (its
  `remat` and its config's), keeping whatever else the graph holds (LoRA adapters, an unrolled tower)."""
  view = nnx.merge(graphdef, params)
  for _, module in nnx.iter_modules(view):
    if getattr(module, "remat", "none") != "none":
      module.remat = "none"
    cfg = getattr(module, "cfg", None)
    if getattr(cfg, "remat", "none") != "none":
      module.cfg = cfg.replace(remat="none")
  return nnx.graphdef(view)
