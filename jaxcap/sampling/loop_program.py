"""A jitted decode loop that, on XLA:CPU, is compiled without while-loop invariant code motion.

XLA:CPU runs a gather from a 16-bit table (the token embedding of each decode step) in float32, converting its
operand. The table is the same at every step, so XLA hoists that convert out of the loop: a float32 copy of the
whole table (1.16 GiB at Qwen2.5-VL's 151936 x 2048) lives for the loop's duration, to read 2-64 rows per step.
Without the hoisting the convert stays fused into the gather, which converts only the rows it takes. Tying the
table to the step instead (as `row_blocks.in_step` does for the layers' weights) does not help: its bit cast is
hoisted in turn, a 16-bit copy of the table. Nothing the loop reads needs hoisting: what it reads once per call
(layer slices, row blocks, casts) is computed before the loop by the program's own code, and each layer's converts
are tied to the step. Measured at the 3B's widths (2 layers, 2 rows, 32 steps): the decode program's temporaries
0.87 -> 0.29 GiB, step time within the noise of a loaded 2-core host. Elsewhere the program is `jax.jit`'s as is.
"""

from __future__ import annotations

import jax

from jaxcap.models import row_blocks

NO_LOOP_HOISTING = {"xla_disable_hlo_passes": "while-loop-invariant-code-motion"}


class LoopProgram:
  """`jax.jit(fn, **jit_kw)`, called or lowered as that, picking on XLA:CPU (`row_blocks.on_cpu`, the ambient
  mesh's devices) a twin compiled with `NO_LOOP_HOISTING`."""

  def __init__(self, fn, **jit_kw):
    self.default = jax.jit(fn, **jit_kw)
    self.cpu = jax.jit(fn, compiler_options=NO_LOOP_HOISTING, **jit_kw)

  def pick(self):
    return self.cpu if row_blocks.on_cpu() else self.default

  def __call__(self, *args, **kw):
    return self.pick()(*args, **kw)

  def lower(self, *args, **kw):
    return self.pick().lower(*args, **kw)
