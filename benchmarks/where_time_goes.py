"""Where the time goes: a `jax.profiler` trace of one path, each XLA op's wall time attributed to the model part
its source line belongs to.

    python -m benchmarks.where_time_goes --path update [--scanned] [--calls 3] [--json update_profile.json]
    python -m benchmarks.where_time_goes --path forward
    python -m benchmarks.where_time_goes --path decode        # one rollout call: prefill + 63 decode steps
    python -m benchmarks.where_time_goes --path forward --floor   # + the program's matmuls timed alone

Same `mid()` shapes as train_step.py / forward.py / rollout.py (8 prompts of one 224x224 image; update: 64 target
tokens each; decode: 8 images x 4 samples x 64 new tokens), float32, random weights (no transformers needed).
Layers run unrolled (`scan_layers=False`, the main job's CPU setting) unless `--scanned`.

How time is attributed: the trace's leaf events on XLA's CPU threads (an op, e.g. one matmul fusion) are swept
in time order and every instant is split equally among the ops running then, so the parts sum to the device's
busy time and ops that overlap on the two cores are not counted twice. Each op is mapped through the compiled
HLO's stack frames to the innermost jaxcap (or optax) function that emitted it, then to a part (see `part_of`).
Matmuls ("dot") and everything else are listed apart. Tracing adds a little overhead; the untimed wall time per
call is printed beside the traced one.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

if not __package__:  # run as a file (python benchmarks/where_time_goes.py): the repository root, for `benchmarks.*`
  sys.path.append(str(Path(__file__).resolve().parents[1]))

from benchmarks.ceilings import _best_seconds, measure_ceilings, model_gemm_shapes  # noqa: E402
from benchmarks.fixtures import image_conversations, run_config  # noqa: E402
from benchmarks.harness import machine_info  # noqa: E402

_SKIP = ("ThunkExecutor", "SlinkyThreadPool", "ThreadpoolListener", "end: ")


# ---------------------------------------------------------------------------------------------- HLO source map
def _sections(hlo: str) -> dict[str, dict[int, str]]:
  """The FileNames / FunctionNames / FileLocations / StackFrames tables printed at the top of an HLO module."""
  out, cur = {}, None
  for line in hlo.splitlines():
    head = line.strip()
    if head in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
      cur = out.setdefault(head, {})
    elif cur is not None and re.match(r"^\d+ ", line):
      i, rest = line.split(" ", 1)
      cur[int(i)] = rest
    elif line.startswith(("%", "ENTRY", "HloModule")) or line.startswith(" "):
      cur = None
  return out


def source_map(hlo: str) -> dict[str, tuple[str, list[tuple[str, str]], str]]:
  """HLO instruction name -> (op_name metadata, [(file path, function)] innermost first, result shape)."""
  s = _sections(hlo)
  files = {k: v.strip('"') for k, v in s.get("FileNames", {}).items()}
  funcs = {k: v.strip('"') for k, v in s.get("FunctionNames", {}).items()}
  locs = {}
  for k, v in s.get("FileLocations", {}).items():
    d = dict(re.findall(r"(\w+)=(\d+)", v))
    locs[k] = (files.get(int(d["file_name_id"]), "?"), funcs.get(int(d["function_name_id"]), "?"))
  frames = {}
  for k, v in s.get("StackFrames", {}).items():
    d = dict(re.findall(r"(\w+)=(\d+)", v))
    frames[k] = (int(d["file_location_id"]), int(d["parent_frame_id"]))

  def chain(fid, top):
    # the printed parent id is one past the parent's own id; the walk stops at the jitted function itself
    out, seen = [], set()
    while fid in frames and fid not in seen:
      seen.add(fid)
      loc, parent = frames[fid]
      out.append(locs.get(loc, ("?", "?")))
      if out[-1][1] == top:
        break
      fid = parent - 1
    return out

  table = {}
  for line in hlo.splitlines():
    m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = (\S+) .*metadata=\{([^}]*)\}", line)
    if m:
      op = re.search(r'op_name="([^"]*)"', m.group(3))
      sf = re.search(r"stack_frame_id=(\d+)", m.group(3))
      op_name = op.group(1) if op else ""
      top = re.match(r"jit\((\w+)\)", op_name)
      table[m.group(1)] = (op_name, chain(int(sf.group(1)), top and top.group(1)) if sf else [], m.group(2))
  return table


def part_of(op_name: str, frames: list[tuple[str, str]], is_dot: bool) -> str:
  """The model part an op belongs to, from its source frames (innermost first)."""
  fns = [fn for _, fn in frames]
  ctx = {fn.split(".")[0] for fn in fns}
  files = {os.path.basename(f) for f, _ in frames}
  own = next((fn for f, fn in frames if "/jaxcap/" in f), "")  # the innermost jaxcap function
  phase = "backward" if "transpose(" in op_name else "forward"
  if any("optax" in f for f, _ in frames) or "_apply" in ctx:
    return "optimizer: clip + AdamW"
  if "distribution.py" in files:
    return "sampling: filters, draw, log-probs"
  if "Qwen25VL.logits" in fns or "_token_stats" in ctx:
    return f"LM head {'matmul' if is_dot else 'log-softmax'} ({phase})"
  side = "vision" if "VisionTower" in ctx else "decoder"
  if "SwiGLU" in ctx:
    return f"{side} MLP {'matmuls' if is_dot else 'activation silu(gate) * up'} ({phase})"
  if "RMSNorm" in ctx:
    return f"{side} RMSNorm"
  if "VisionAttention" in ctx or "_blocked_attention" in ctx:
    if is_dot and "_blocked_attention" not in ctx:
      return f"vision attention projections ({phase})"
    return f"vision attention core: gather, scores, softmax ({phase})"
  if "Attention" in ctx:
    if is_dot and "Linear" in ctx:
      return f"decoder attention projections ({phase})"
    return f"decoder attention core: rotary, scores, softmax, cache ({phase})"
  if own.startswith(("scan_layers", "stacked", "Qwen25VL.layer_params")):
    return "layer stack: per-layer weight slices, gradient stacking"
  if own.startswith("_accumulate"):
    return "gradient accumulation"
  if side == "vision":
    return "vision other: patch embed, merger, rotary, window order"
  if own.startswith("Qwen25VL.embed"):
    return "embedding + vision placement"
  if own.startswith(("DecoderLayer", "Qwen25VL.decode", "mrope", "completion_positions")):
    return "decoder other: residual adds, masks, rope tables"
  if "generate.py" in files or "sampler.py" in files:
    return "decode loop bookkeeping"
  return "other" + (" (matmul)" if is_dot else "")


# ---------------------------------------------------------------------------------------------- trace -> parts
def attribute(xspace_path: str, table: dict, calls: int) -> tuple[dict[str, float], float, list]:
  """{part: ms per call} from a trace's leaf op events (time split equally among overlapping ops), the
  device-busy ms per call, and [(ms per call, op, part, result shape)] per op, largest first."""
  from jax.profiler import ProfileData

  per_line = collections.defaultdict(list)
  for plane in ProfileData.from_file(xspace_path).planes:
    if plane.name not in ("/host:CPU",) and not plane.name.startswith("/device:"):
      continue
    for line in plane.lines:
      if plane.name == "/host:CPU" and not line.name.startswith("tf_XLA"):
        continue
      for e in line.events:
        if e.duration_ns > 0 and not e.name.startswith(_SKIP):
          per_line[(plane.name, line.name)].append((e.start_ns, e.start_ns + e.duration_ns, e.name))
  leaves = []
  for events in per_line.values():
    events.sort()
    for i, (a, b, name) in enumerate(events):
      if i + 1 < len(events) and events[i + 1][0] < b:
        continue  # it encloses the next event (a loop, a call): count its children instead
      leaves.append((a, b, name))
  edges = sorted([(a, 1, i) for i, (a, _, _) in enumerate(leaves)] + [(b, -1, i) for i, (_, b, _) in enumerate(leaves)])
  share, active, last = collections.Counter(), set(), None
  for t, kind, i in edges:
    if last is not None and active:
      dt = (t - last) / len(active)
      for j in active:
        share[leaves[j][2]] += dt
    last = t
    (active.add if kind == 1 else active.discard)(i)
  parts, ops = collections.Counter(), []
  for name, ns in share.items():
    op_name, frames, shape = table.get(name, ("", [], "?"))
    is_dot = name.startswith(("ynn", "xnn", "dot", "onednn")) or op_name.endswith("dot_general")
    part = part_of(op_name, frames, is_dot)
    parts[part] += ns / 1e6 / calls
    ops.append((ns / 1e6 / calls, name, part, shape))
  return dict(parts), sum(share.values()) / 1e6 / calls, sorted(ops, reverse=True)


# ---------------------------------------------------------------------------------------------- matmuls alone
_DTYPES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16", "f64": "float64"}


def program_dots(hlo: str) -> list[dict]:
  """Every dot of a compiled (loop-free) HLO module: operand dtypes, shapes in memory order (each operand's dims
  permuted major-to-minor by its layout, so a transposed operand is read as it lies), dimension numbers in that
  order, and FLOPs (2 x output elements x contracted size)."""
  shapes = {}
  for m in re.finditer(r"%([\w.\-]+) = (\w+)\[([\d,]*)\]\{([\d,]*)", hlo):
    dims = [int(d) for d in m.group(3).split(",") if d]
    minor_to_major = [int(d) for d in m.group(4).split(",") if d]
    shapes[m.group(1)] = (m.group(2), dims, minor_to_major[::-1] or list(range(len(dims))))
  dots = []
  for m in re.finditer(r"= (\w+)\[([\d,]*)\]\S* dot\(%([\w.\-]+), %([\w.\-]+)\)([^\n]*)", hlo):
    out_dtype, out_dims, lhs, rhs, attrs = m.groups()
    nums = {
      k: [int(d) for d in v.split(",") if d]
      for k, v in re.findall(r"(\w+_(?:batch|contracting)_dims)=\{([\d,]*)\}", attrs)
    }
    operands = []
    for side, name in (("lhs", lhs), ("rhs", rhs)):
      dtype, dims, order = shapes[name]
      where = {logical: i for i, logical in enumerate(order)}
      operands.append(
        dict(
          dtype=_DTYPES[dtype],
          shape=[dims[i] for i in order],
          batch=[where[d] for d in nums.get(f"{side}_batch_dims", [])],
          contracting=[where[d] for d in nums.get(f"{side}_contracting_dims", [])],
        )
      )
    contracted = int(np.prod([shapes[lhs][1][d] for d in nums.get("lhs_contracting_dims", [])]))
    out = int(np.prod([int(d) for d in out_dims.split(",") if d]))
    dots.append(dict(out_dtype=_DTYPES[out_dtype], lhs=operands[0], rhs=operands[1], flops=2.0 * out * contracted))
  return dots


def time_dots_alone(dots: list[dict], budget_s: float = 0.3) -> tuple[float, float]:
  """(seconds, FLOPs) of the program's dots each run alone as its own jitted call (best of several calls, less
  the dispatch time of a call that does nothing): how long the matmuls take with nothing else in the program."""
  import collections

  import jax
  import jax.numpy as jnp

  def key(d):
    return json.dumps([d["out_dtype"], d["lhs"], d["rhs"]], sort_keys=True)

  counts = collections.Counter(key(d) for d in dots)
  rng = np.random.default_rng(0)
  idle = jax.jit(lambda a, b: a.reshape(-1)[0] + b.reshape(-1)[0])
  seconds = 0.0
  for k, n in counts.items():
    out_dtype, lhs, rhs = json.loads(k)
    a, b = (jnp.asarray(rng.standard_normal(o["shape"]), o["dtype"]) for o in (lhs, rhs))
    dims = ((lhs["contracting"], rhs["contracting"]), (lhs["batch"], rhs["batch"]))
    dot = jax.jit(lambda a, b, dims=dims: jax.lax.dot_general(a, b, dims, preferred_element_type=out_dtype))
    alone = _best_seconds(lambda: dot(a, b).block_until_ready(), budget_s)
    overhead = _best_seconds(lambda: idle(a, b).block_until_ready(), budget_s / 3)
    seconds += n * max(alone - overhead, 0.0)
  return seconds, sum(d["flops"] for d in dots)


# ---------------------------------------------------------------------------------------------- the paths
def _model(scanned: bool):
  import dataclasses

  from flax import nnx

  import jaxcap.models as M
  from jaxcap.processing import Processor, word_tokenizer

  cfg = dataclasses.replace(M.mid(), scan_layers=scanned)
  model = M.Qwen25VL(cfg, rngs=nnx.Rngs(0))
  processor = Processor(word_tokenizer("describe the image in detail .".split(), cfg), cfg)
  return cfg, model, processor


def _batch(processor, images: int, side: int = 224, padding_side="left"):
  return processor(image_conversations(images, side, np.random.RandomState(0)), padding_side=padding_side)


def _flops(cfg, params, batch, completion: int) -> float:
  """Model FLOPs of an update at this batch (`jaxcap.models.flops`, the benchmarks' convention)."""
  from jaxcap.models.flops import model_flops, param_counts

  b, p = batch.input_ids.shape
  per_image = int(np.prod(batch.grid_thw[0]))
  counts = param_counts(params)
  return model_flops(cfg, counts, sequences=b, prompt=p, completion=completion, images=b, patches_per_image=per_image)[
    "total"
  ]


def update_path(scanned: bool):
  """The sft update of train_step.py: 8 prompts + 64 target tokens each, AdamW, one micro-batch."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from jaxcap.models.vision import vision_layout
  from jaxcap.train.programs import RunPrograms
  from jaxcap.train.state import init_train_state
  from jaxcap.train.step import PromptBatch

  cfg, model, processor = _model(scanned)
  batch = _batch(processor, 8)
  targets = jnp.asarray(np.random.RandomState(1).randint(10, 30000, size=(1, 8, 64)).astype(np.int32))
  graphdef, params = nnx.split(model)
  programs = RunPrograms(run_config("sft", lr=1e-5, steps=1000), graphdef)
  optimizer = programs.optimizer("sft")
  state = {"s": init_train_state(params, optimizer, jax.random.key(0))}
  prompts = PromptBatch(
    *(jnp.asarray(x)[None] for x in (batch.input_ids, batch.positions, batch.attention_mask)),
    jnp.asarray(batch.pixel_values)[None],
  )
  layout = vision_layout(batch.grid_thw, cfg.vision)
  mask = jnp.ones_like(targets, dtype=bool)
  step = programs.update("sft", optimizer, jax.tree.map(lambda x: x.sharding, state["s"]))
  compiled = step.lower(state["s"], prompts, targets, mask, layout).compile()

  def call():
    state["s"], m = compiled(state["s"], prompts, targets, mask, layout)
    jax.block_until_ready(m["loss"])

  flops = _flops(cfg, params, batch, completion=targets.shape[-1])
  return compiled.as_text(), call, flops


def forward_path(scanned: bool):
  """The prefill forward of forward.py: 8 prompts, logits at every position."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  cfg, model, processor = _model(scanned)
  batch = _batch(processor, 8, padding_side="right")
  graphdef, params = nnx.split(model)

  @jax.jit
  def forward(params, ids, pos, mask, vision):
    return nnx.merge(graphdef, params)(ids, pos, mask, vision)[0]

  args = (
    jnp.asarray(batch.input_ids),
    jnp.asarray(batch.positions),
    jnp.asarray(batch.attention_mask),
    jax.tree.map(jnp.asarray, batch.vision()),
  )
  compiled = forward.lower(params, *args).compile()
  b, p = batch.input_ids.shape
  flops = _flops(cfg, params, batch, completion=0) / 3 + 2 * cfg.text.hidden_size * cfg.text.vocab_size * b * p
  return compiled.as_text(), lambda: compiled(params, *args).block_until_ready(), flops


def decode_path(scanned: bool, images: int = 8, samples: int = 4, new_tokens: int = 64):
  """One rollout call of rollout.py: 8 images x 4 samples x 64 new tokens, temperature 1, no stop tokens."""
  import itertools

  import jax

  from jaxcap.sampling import Sampler
  from jaxcap.train.programs import sampling_config

  cfg, model, processor = _model(scanned)
  batch = _batch(processor, images)
  sampling = sampling_config(run_config(max_new_tokens=new_tokens), stop_ids=())
  sampler = Sampler(model, processor=processor, sampling=sampling)
  keys = itertools.count()
  call = lambda: jax.block_until_ready(sampler(batch, jax.random.key(next(keys)), num_samples=samples).tokens)
  call()  # compiles; the HLO of every program it ran is read from the dump below
  return None, call, None


PATHS = {"update": update_path, "forward": forward_path, "decode": decode_path}


def _print_floor(hlo: str, flops: float, wall_ms: float) -> dict:
  """The matmuls-alone floor of a program and the bound it puts on the program's fraction of the GEMM ceiling."""
  import jaxcap.models as M

  if re.search(r" while\(", hlo):
    raise SystemExit("--floor: the program has a loop (its dots run more than once); use the unrolled layers")
  dots = program_dots(hlo)
  alone_s, dot_flops = time_dots_alone(dots)
  ceiling = measure_ceilings(model_gemm_shapes(M.mid(), 1024), with_torch=False)["xla_gemm_gflops"]
  out = dict(
    dots=len(dots),
    dot_gflop=dot_flops / 1e9,
    dots_alone_ms=alone_s * 1e3,
    dot_gflops_alone=dot_flops / alone_s / 1e9,
    model_gflop=flops / 1e9,
    xla_gemm_ceiling_gflops=ceiling,
    of_ceiling=flops / 1e9 / (wall_ms / 1e3) / ceiling,
    bound_of_ceiling=flops / 1e9 / alone_s / ceiling,
  )
  print(
    f"matmuls alone: {out['dots']} dots, {out['dot_gflop']:.1f} GFLOP, {out['dots_alone_ms']:.0f} ms run one by one "
    f"({out['dot_gflops_alone']:.0f} GFLOP/s; XLA's best GEMM here {ceiling:.0f} GFLOP/s) vs {wall_ms:.0f} ms the "
    f"whole call"
  )
  print(
    f"model FLOPs {out['model_gflop']:.1f} GFLOP per call: the call runs at {100 * out['of_ceiling']:.0f}% of the "
    f"ceiling; with everything but its matmuls free it would run at {100 * out['bound_of_ceiling']:.0f}%"
  )
  return out


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--path", choices=sorted(PATHS), default="update")
  ap.add_argument("--scanned", action="store_true", help="layers under lax.scan (the real-checkpoint setting)")
  ap.add_argument("--calls", type=int, default=3, help="traced calls (after 2 untraced warm-up calls)")
  ap.add_argument("--ops", type=int, default=0, help="also list the N costliest ops (name, shape, part)")
  ap.add_argument("--json", metavar="PATH", help="also write the table as JSON")
  ap.add_argument(
    "--floor",
    action="store_true",
    help="also time the program's matmuls alone and bound the fraction of the GEMM ceiling any program with these "
    "matmuls can reach (forward / update, unrolled)",
  )
  args = ap.parse_args()
  if args.floor and (args.path == "decode" or args.scanned):
    ap.error("--floor reads one loop-free program: --path forward or update, without --scanned")

  dump = tempfile.mkdtemp(prefix="jaxcap_hlo_")
  if args.path == "decode":  # several programs (prefill, decode loop): read their HLO from XLA's dump
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={dump} --xla_dump_hlo_as_text"
  import jax

  hlo, call, flops = PATHS[args.path](args.scanned)
  texts = [hlo] if hlo else [open(p).read() for p in glob.glob(os.path.join(dump, "*after_optimizations.txt"))]
  table = {}
  for text in texts:  # decode: op names repeat across programs (prefill, loop); a later program's entry wins
    table.update(source_map(text))
  call()
  call()
  t0 = time.perf_counter()
  for _ in range(args.calls):
    call()
  wall_ms = (time.perf_counter() - t0) / args.calls * 1e3
  trace = tempfile.mkdtemp(prefix="jaxcap_trace_")
  options = jax.profiler.ProfileOptions()
  options.python_tracer_level = 0
  jax.profiler.start_trace(trace, profiler_options=options)
  t0 = time.perf_counter()
  for _ in range(args.calls):
    call()
  traced_ms = (time.perf_counter() - t0) / args.calls * 1e3
  jax.profiler.stop_trace()
  path = sorted(glob.glob(os.path.join(trace, "**", "*.xplane.pb"), recursive=True))[-1]
  parts, busy_ms, ops = attribute(path, table, args.calls)

  info = machine_info()
  print(f"machine: {info.get('cpu_model', '?')}, {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}")
  print(f"path: {args.path} ({'scanned' if args.scanned else 'unrolled'} layers), {args.calls} traced calls")
  print(f"wall per call: {wall_ms:.0f} ms untraced, {traced_ms:.0f} ms traced; ops busy {busy_ms:.0f} ms")
  print(f"{'part':70s} {'ms/call':>8s} {'share':>6s}")
  for name, ms in sorted(parts.items(), key=lambda kv: -kv[1]):
    print(f"{name:70s} {ms:8.1f} {100 * ms / busy_ms:5.1f}%")
  for ms, name, part, shape in ops[: args.ops]:
    print(f"  {ms:8.2f} ms  {name:32s} {shape:40s} {part}")
  floor = _print_floor(hlo, flops, wall_ms) if args.floor else None
  if args.json:
    with open(args.json, "w") as f:
      json.dump(
        dict(
          path=args.path,
          scanned=args.scanned,
          wall_ms=wall_ms,
          traced_ms=traced_ms,
          busy_ms=busy_ms,
          parts=parts,
          floor=floor,
          machine=info,
        ),
        f,
        indent=2,
      )


if __name__ == "__main__":
  from jaxcap.host_memory import retain_on_cpu

  retain_on_cpu()  # as the launcher does (JAXCAP_HOST_MALLOC=system: glibc defaults)
  main()
