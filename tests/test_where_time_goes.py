"""benchmarks/where_time_goes.py's parts (hlo_source, op_attribution, matmul_floor): HLO ops are traced back to the
functions that emitted them, parts are named from those frames, and a trace's op time is split so overlapping ops
are not counted twice."""

import glob
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))  # the repository root, for `benchmarks`
from benchmarks import hlo_source, matmul_floor, op_attribution  # noqa: E402


def _project(x, w):
  return jnp.tanh(x @ w)


def _two_layers(x, w1, w2):
  return _project(_project(x, w1), w2).sum()


def _args():
  rng = np.random.default_rng(0)
  return [jnp.asarray(rng.standard_normal(s, np.float32)) for s in ((256, 128), (128, 512), (512, 64))]


def test_source_map_walks_each_op_back_to_the_jitted_function():
  compiled = jax.jit(_two_layers).lower(*_args()).compile()
  table = hlo_source.source_map(compiled.as_text())
  dots = [(name, frames) for name, (op, frames, _) in table.items() if op.endswith("dot_general")]
  assert dots, "no dot in the compiled HLO's metadata"
  for _, frames in dots:
    functions = [fn for _, fn in frames]
    assert functions[0] == "_project" and functions[-1] == "_two_layers", functions
    assert all(path.endswith("test_where_time_goes.py") for path, _ in frames)


@pytest.mark.parametrize(
  "frames, is_dot, op_name, part",
  [
    (
      [
        ("/x/flax/nnx/nn/linear.py", "Linear.__call__"),
        ("/r/jaxcap/models/layers.py", "SwiGLU.__call__"),
        ("/r/jaxcap/models/qwen25vl.py", "DecoderLayer.__call__"),
      ],
      True,
      "jit(f)/jvp()/dot_general",
      "decoder MLP matmuls (forward)",
    ),
    (
      [("/r/jaxcap/models/layers.py", "SwiGLU.__call__"), ("/r/jaxcap/models/vision.py", "VisionTower.__call__")],
      False,
      "jit(f)/transpose(jvp())/mul",
      "vision MLP activation silu(gate) * up (backward)",
    ),
    (
      [("/x/optax/_src/transform.py", "update_fn"), ("/r/jaxcap/train/steps/updates.py", "_apply")],
      False,
      "",
      "optimizer: clip + AdamW",
    ),
    (
      [("/r/jaxcap/models/vision.py", "_blocked_attention"), ("/r/jaxcap/models/vision.py", "VisionTower.__call__")],
      True,
      "",
      "vision attention core: gather, scores, softmax (forward)",
    ),
    (
      [("/r/jaxcap/models/qwen25vl.py", "cached_attention"), ("/r/jaxcap/models/qwen25vl.py", "Attention.__call__")],
      False,
      "",
      "decoder attention core: rotary, scores, softmax, cache (forward)",
    ),
    (
      [("/r/jaxcap/models/layers.py", "scan_layers"), ("/r/jaxcap/models/qwen25vl.py", "Qwen25VL.decode")],
      False,
      "",
      "layer stack: per-layer weight slices, gradient stacking",
    ),
    (
      [("/r/jaxcap/models/qwen25vl.py", "Qwen25VL.logits"), ("/r/jaxcap/train/steps/logprobs.py", "_token_stats")],
      True,
      "jit(f)/transpose(jvp(nd,vd->nv))/dot_general",
      "LM head matmul (backward)",
    ),
  ],
)
def test_parts_are_named_from_the_innermost_model_frames(frames, is_dot, op_name, part):
  assert op_attribution.part_of(op_name, frames, is_dot) == part


def test_attribution_splits_overlapping_time_and_sums_to_the_busy_time(tmp_path):
  args = _args()
  compiled = jax.jit(_two_layers).lower(*args).compile()
  table = hlo_source.source_map(compiled.as_text())
  compiled(*args).block_until_ready()
  jax.profiler.start_trace(str(tmp_path))
  for _ in range(3):
    compiled(*args).block_until_ready()
  jax.profiler.stop_trace()
  path = sorted(glob.glob(os.path.join(tmp_path, "**", "*.xplane.pb"), recursive=True))[-1]
  parts, busy_ms, ops = op_attribution.attribute(path, table, calls=3)
  assert busy_ms > 0 and ops
  assert sum(parts.values()) == pytest.approx(busy_ms, rel=1e-6)
  assert sum(ms for ms, *_ in ops) == pytest.approx(busy_ms, rel=1e-6)
  # every op of this function is its own: nothing lands in a model part
  assert set(parts) <= {"other", "other (matmul)"}, parts
  assert parts.get("other (matmul)", 0) > 0


def test_program_dots_reads_every_matmul_with_its_shapes_and_flops():
  """A transposed operand and a batched contraction: each dot is found once, read in memory order, and its FLOPs
  are 2 x output elements x contracted size; timed alone, the dots report those FLOPs and a positive time."""
  rng = np.random.default_rng(0)
  a, b = (jnp.asarray(rng.standard_normal(s, np.float32)) for s in ((96, 64), (80, 64)))
  p, q = (jnp.asarray(rng.standard_normal(s, np.float32)) for s in ((4, 24, 16), (4, 16, 40)))
  f = jax.jit(lambda a, b, p, q: (jnp.tanh(a @ b.T).sum(), jnp.einsum("bij,bjk->bik", p, q).sum()))
  dots = matmul_floor.program_dots(f.lower(a, b, p, q).compile().as_text())
  assert sorted(d["flops"] for d in dots) == sorted([2.0 * 96 * 80 * 64, 2.0 * 4 * 24 * 40 * 16])
  for d in dots:
    lhs, rhs = d["lhs"], d["rhs"]
    contracted = [lhs["shape"][i] for i in lhs["contracting"]]
    assert contracted == [rhs["shape"][i] for i in rhs["contracting"]]
    assert [lhs["shape"][i] for i in lhs["batch"]] == [rhs["shape"][i] for i in rhs["batch"]]
  seconds, flops = matmul_floor.time_dots_alone(dots, budget_s=0.05)
  assert seconds > 0 and flops == sum(d["flops"] for d in dots)
