"""`python -m jaxcap.plan --config=configs/caprl.py:paper --model=qwen2.5-vl-3b --topology=cpu:8`: will a run fit?

Lowers and compiles, ahead of time and with abstract weights (no checkpoint is read, nothing is allocated), the
programs a run executes — the RL update step, the log-prob pass, the sampler's prefill and decode loop — for the
config's model, batch and mesh on a target topology, and prints per device: memory (resident train state +
each program's arguments / temporaries / outputs) against the chip's memory, compile time and FLOPs per call,
then a verdict: fits, or does not fit and what to change.

Topologies: `cpu:N` (N virtual XLA:CPU devices; XLA:CPU keeps bf16 temporaries in f32, so its figures are an
upper bound) or `tpu:<chip>:<shape>` (e.g. `tpu:v5e:4x4`, `tpu:v5p:2x2x2`; the real TPU compiler through
`libtpu`, `pip install -e ".[plan-tpu]"`, no TPU attached).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from flax import nnx
from jax.experimental import topologies
from jax.sharding import NamedSharding
from ml_collections import config_flags

from jaxcap.checkpoint import read_config
from jaxcap.models.config import dtype_from_name
from jaxcap.models.families import DEFAULT_FAMILY, family_of_config, layout_for, preset_config, preset_names
from jaxcap.models.flops import model_flops, param_counts, peak_tflops
from jaxcap.models.qwen25vl import CACHE_AXES, VisionInput
from jaxcap.processing.vision import smart_resize
from jaxcap.sampling import generate
from jaxcap.sampling.prompts import Prompts, batch_bucket
from jaxcap.sharding import logical_to_spec, make_mesh
from jaxcap.train.packed import PackedInputs
from jaxcap.train.packed_batch import planned_rows
from jaxcap.train.programs import RunPrograms, packs, rollout_correction_config, with_reference
from jaxcap.train.adapters import format_breakdown, lora_advice, state_breakdown, with_run_lora
from jaxcap.train.state import _fresh_state, train_state_shardings
from jaxcap.train.step import PromptBatch, RolloutBatch

# HBM per chip, GiB, of the TPU generations libtpu compiles for
TPU_HBM_GIB = {"v4": 32, "v5e": 16, "v5litepod": 16, "v5p": 95, "v6e": 32}
GIB = 2**30


@dataclasses.dataclass
class ProgramPlan:
  """One compiled program's per-device figures (bytes), compile time (s) and XLA's FLOPs per call (which count a
  scanned layer stack's body once: see `update_model_tflop` for the model's)."""

  name: str
  arguments: int
  outputs: int
  aliased: int
  temporaries: int
  resident_outside: int  # train-state bytes on the device that the program does not take as arguments
  compile_s: float
  flops: float
  fingerprint: str = ""  # sha256 of the lowered program's text: equal fingerprints, equal programs

  @property
  def peak(self) -> int:
    return self.resident_outside + self.arguments + self.temporaries + self.outputs - self.aliased


def program_fingerprint(lowered) -> str:
  """sha256 of a lowered program's StableHLO text (what XLA compiles; no source locations)."""
  return hashlib.sha256(lowered.as_text().encode()).hexdigest()


def topology_devices(topology: str):
  """The devices of `topology` ('cpu:N' needs XLA_FLAGS set before jax starts; see `main`)."""

  kind, _, rest = topology.partition(":")
  if kind == "cpu":
    n = int(rest or 1)
    devices = jax.devices("cpu")
    if len(devices) < n:
      raise ValueError(f"--topology={topology}: jax has {len(devices)} CPU devices; run jaxcap.plan in a fresh process")
    return devices[:n], None
  if kind == "tpu":
    chip, _, shape = rest.partition(":")
    dims = [int(d) for d in shape.split("x") if d.isdigit()]
    # libtpu's default host is 2x2 chips; a smaller slice (v5e:1x1, one chip) is a host of its own size
    kw = {"chips_per_host_bounds": (dims + [1, 1, 1])[:3]} if dims and int(np.prod(dims)) < 4 else {}
    try:
      desc = topologies.get_topology_desc(topology_name=f"{chip}:{shape}", platform="tpu", **kw)
    except Exception as e:  # no libtpu, or a shape it does not know
      raise SystemExit(
        f"--topology={topology}: cannot build the TPU topology ({type(e).__name__}: {e}). Install the TPU "
        'compiler with `pip install -e ".[plan-tpu]"` and name a real slice, e.g. tpu:v5e:4x4 or tpu:v5p:2x2x2.'
      ) from None
    return list(desc.devices), TPU_HBM_GIB.get(chip)
  raise SystemExit(f"--topology={topology!r}: use cpu:N or tpu:<chip>:<shape>")


def model_config(config, name: str | None):

  m = config.model
  name = name or m.checkpoint
  if not name:
    raise SystemExit(
      f"the config trains the embedded student; pass --model={' | '.join(preset_names())} or a "
      "checkpoint directory (or set model.checkpoint)"
    )
  kw = dict(
    dtype=dtype_from_name(m.dtype),
    param_dtype=dtype_from_name(m.param_dtype),
    remat=m.remat,
    logprob_chunk=m.logprob_chunk,
    scan_layers=m.scan_layers,
  )
  if name in preset_names():
    return preset_config(name, m.get("family", DEFAULT_FAMILY), **kw)
  if Path(name).is_dir():
    return read_config(name, **kw)
  raise SystemExit(f"--model={name!r}: not a preset ({', '.join(preset_names())}) nor a checkpoint directory")


def image_grid(cfg, image_size: int, max_pixels: int = 0) -> tuple[int, int, int]:
  """(t, h, w) patch grid of the largest image a run feeds, after smart_resize (as the processor does): one
  square `image_size` image, or with native sizes (image_size 0) a square one at the `max_pixels` budget."""

  v = cfg.vision
  factor = v.patch_size * v.spatial_merge_size
  if image_size:
    h, w = smart_resize(image_size, image_size, factor)
  elif max_pixels:
    side = int(max_pixels**0.5)
    h, w = smart_resize(side, side, factor, max_pixels=max_pixels)
  else:
    raise SystemExit(
      "data.image_size=0 (native sizes) with data.max_pixels=0 (the checkpoint's budget, up to 12.8 MP per image): "
      "set --config.data.max_pixels (e.g. 200704 = 448 x 448) or --config.data.image_size to plan the run"
    )
  return 1, h // v.patch_size, w // v.patch_size


def per_device_bytes(tree) -> int:
  """Bytes one device holds of a tree of sharded ShapeDtypeStructs / arrays (the first device's shard)."""

  total = 0
  for x in jax.tree.leaves(tree):
    shape = x.sharding.shard_shape(x.shape) if getattr(x, "sharding", None) is not None else x.shape
    bits = 64 if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else jax.dtypes.itemsize_bits(x.dtype)
    total += int(np.prod(shape)) * bits // 8  # 4-bit types (QLoRA's int4 / nf4 base): half a byte
  return total


def rl_step_inputs(config, cfg, mesh, abstract_params, optimizer, text: int = 48) -> SimpleNamespace:
  """The abstract arguments (shapes, dtypes, shardings on `mesh`) of the run's RL step at its largest prompt:
  state, prompts, rollouts, layout, plus the sizes they were built from."""
  rl, s = config.rl, config.sampling
  prompts_total, g, m = rl.batch_size * max(1, config.distributed.num_processes or 1), rl.num_samples, rl.micro_batches
  b = prompts_total // m
  grid = image_grid(cfg, config.data.image_size, config.data.get("max_pixels", 0))
  patches = int(np.prod(grid))
  vision_tokens = patches // cfg.vision.spatial_merge_size**2
  mult = config.data.pad_to_multiple
  p = -(-(vision_tokens + text) // mult) * mult
  c = s.max_new_tokens
  with_ref = with_reference(config, "rl")
  key = jax.eval_shape(lambda: jax.random.key(0))
  abstract_state = jax.eval_shape(lambda prm, k: _fresh_state(prm, optimizer, k, with_ref), abstract_params, key)
  state = _with_shardings(abstract_state, train_state_shardings(abstract_state, mesh))

  def arr(shape, dtype, logical):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, logical_to_spec(logical, shape, mesh)))

  layout = layout_for(np.asarray([grid] * b), cfg.vision)
  prompt_batch = PromptBatch(
    arr((m, b, p), jnp.int32, (None, "batch", None)),
    arr((m, 3, b, p), jnp.int32, (None, None, "batch", None)),
    arr((m, b, p), jnp.bool_, (None, "batch", None)),
    arr((m, b * patches, cfg.vision.patch_dim), jnp.float32, (None, "batch", None)),
  )
  f32 = lambda shape, logical: arr(shape, jnp.float32, logical)
  rollouts = RolloutBatch(
    tokens=arr((m, b * g, c), jnp.int32, (None, "batch", None)),
    mask=arr((m, b * g, c), jnp.bool_, (None, "batch", None)),
    old_logprobs=f32((m, b * g, c), (None, "batch", None)),
    rewards=f32((m, b, g, 1), (None, "batch", None, None)),
    reward_valid=arr((m, b, g, 1), jnp.bool_, (None, "batch", None, None)),
    weights=f32((1,), (None,)),
    ref_logprobs=f32((m, b * g, c), (None, "batch", None)) if with_ref else None,
    behaviour_logprobs=f32((m, b * g, c), (None, "batch", None)) if rollout_correction_config(config).enabled else None,
    truncated=arr((m, b * g), jnp.bool_, (None, "batch")) if config.rl.mask_truncated else None,
  )
  return SimpleNamespace(
    state=state, prompts=prompt_batch, rollouts=rollouts, layout=layout, arr=arr, prompts_total=prompts_total, g=g,
    p=p, c=c, grid=grid, patches=patches,
  )  # fmt: skip


def plan(config, cfg, devices, hbm_gib: float, names=("rl_step", "logprobs", "prefill", "decode"), text=48):
  """Compiles the programs `names` for `config` (batch, mesh, sampling) and model `cfg` on `devices`; returns a dict."""

  mesh = make_mesh(dict(config.mesh.shape), devices=devices)
  model_cls = family_of_config(cfg).model_cls
  # with model.lora: the adapters and any quantized base, as the run builds them
  graphdef, abstract_params = nnx.split(nnx.eval_shape(lambda: with_run_lora(model_cls(cfg, rngs=nnx.Rngs(0)), config)))
  programs = RunPrograms(config, graphdef)  # the trainer's own builder: the programs compiled here are the run's
  opt = programs.optimizer("rl")
  inputs = rl_step_inputs(config, cfg, mesh, abstract_params, opt, text)
  state, prompt_batch, rollouts, layout = inputs.state, inputs.prompts, inputs.rollouts, inputs.layout
  params, key, arr = state.params, state.key, inputs.arr
  prompts_total, g, p, c, grid, patches = (
    inputs.prompts_total,
    inputs.g,
    inputs.p,
    inputs.c,
    inputs.grid,
    inputs.patches,
  )
  state_bytes = per_device_bytes(state)
  params_bytes = per_device_bytes(params)
  rows = batch_bucket(prompts_total)
  sample_layout = layout_for(np.asarray([grid] * rows), cfg.vision)
  sample_prompts = Prompts(
    arr((rows, p), jnp.int32, ("batch", None)),
    arr((rows, p), jnp.bool_, ("batch", None)),
    arr((3, rows, p), jnp.int32, (None, "batch", None)),
    arr((rows,), jnp.int32, ("batch",)),
    VisionInput(arr((rows * patches, cfg.vision.patch_dim), jnp.float32, ("batch", None)), sample_layout),
  )
  gen_kw = programs.generation_statics(cfg, pad_id=0)

  results: list[ProgramPlan] = []

  def compile_one(name, lower, args, resident_outside):
    t0 = time.perf_counter()
    with jax.set_mesh(mesh):
      lowered = lower(*args)
      compiled = lowered.compile()
    seconds = time.perf_counter() - t0
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    results.append(
      ProgramPlan(
        name,
        int(mem.argument_size_in_bytes),
        int(mem.output_size_in_bytes),
        int(mem.alias_size_in_bytes),
        int(mem.temp_size_in_bytes),
        resident_outside,
        seconds,
        float((cost or {}).get("flops", 0.0)),
        program_fingerprint(lowered),
      )
    )
    return compiled

  if packs(config):  # packed micro-batches at the budget (rl.micro_batch_tokens): the step's pixels, one pack
    budget_tokens = int(config.rl.micro_batch_tokens)
    packed_rows = planned_rows(prompts_total, g, p, c, grid, budget_tokens, cfg, config.data.bucket_steps)
    replicated = lambda x: jax.ShapeDtypeStruct(
      x.shape, x.dtype, sharding=NamedSharding(mesh, logical_to_spec((), (), mesh))
    )
    pixels = arr((prompts_total * patches, cfg.vision.patch_dim), jnp.float32, (None, None))
    layout = PackedInputs(pixels, jax.tree.map(replicated, packed_rows))
    prompt_batch = dataclasses.replace(prompt_batch, pixel_values=None)
  if "rl_step" in names:
    jitted = programs.update("rl", opt, jax.tree.map(lambda x: x.sharding, state))
    compile_one("rl_step", jitted.lower, (state, prompt_batch, rollouts, layout), 0)
  if "logprobs" in names:
    lower = programs.logprobs().lower
    compile_one("logprobs", lower, (params, prompt_batch, layout, rollouts.tokens), state_bytes - params_bytes)
  if {"prefill", "decode"} & set(names):
    sample_key = jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=NamedSharding(mesh, logical_to_spec((), (), mesh)))
    prefill = functools.partial(generate.prefill_jit.lower, num_samples=g, **gen_kw)
    with jax.set_mesh(mesh):
      decode_state = jax.eval_shape(
        functools.partial(generate.prefill, num_samples=g, **gen_kw), params, sample_prompts, sample_key
      )
    if "prefill" in names:
      compile_one("prefill", prefill, (params, sample_prompts, sample_key), state_bytes - params_bytes)
    if "decode" in names:
      decode_state = _with_shardings(decode_state, _decode_state_shardings(decode_state, mesh))
      decode = functools.partial(generate.decode_jit.lower, **gen_kw)
      compile_one("decode", decode, (params, decode_state), state_bytes - params_bytes)

  counts = param_counts(abstract_params)
  flops = model_flops(
    cfg, counts, sequences=prompts_total * g, prompt=p, completion=c, images=prompts_total, patches_per_image=patches
  )
  chip_tflops = peak_tflops(getattr(devices[0], "device_kind", ""))
  peak = max((r.peak for r in results), default=state_bytes)
  budget = hbm_gib * GIB
  return {
    "model": {"params": sum(int(np.prod(x.shape)) for x in jax.tree.leaves(abstract_params))},
    "mesh": dict(mesh.shape),
    "devices": len(devices),
    "device_kind": getattr(devices[0], "device_kind", str(devices[0].platform)),
    "batch": {
      "prompts": prompts_total,
      "samples": g,
      "micro_batches": f"{packed_rows.shape[0]} packed" if packs(config) else config.rl.micro_batches,
      "prompt_tokens": p,
      "completion": c,
    },
    "image_grid": grid,
    "update_model_tflop": flops["total"] / 1e12,
    "update_s_at_40pct_mfu": flops["total"] / len(devices) / (0.4 * chip_tflops * 1e12) if chip_tflops else None,
    "train_state_gib_per_device": state_bytes / GIB,
    "train_state_parts": state_breakdown(state, config),
    "params_gib_per_device": params_bytes / GIB,
    "programs": [dataclasses.asdict(r) | {"peak": r.peak} for r in results],
    "hbm_gib": hbm_gib,
    "peak_gib": peak / GIB,
    "fits": peak <= budget,
    "advice": advice(config, results, state_bytes, budget, mesh),
  }


def _with_shardings(abstract, shardings):

  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, shardings)


def _decode_state_shardings(state, mesh):
  """The decode state's layout as the sampler keeps it: KV cache and per-row arrays over the batch axes."""

  def one(path, x):
    name = jax.tree_util.keystr(path)
    if "cache" in name:
      logical = CACHE_AXES
    elif x.ndim >= 1 and "prompt_length" not in name:
      logical = ("batch",) + (None,) * (x.ndim - 1)
    else:
      logical = (None,) * x.ndim
    return NamedSharding(mesh, logical_to_spec(logical, x.shape, mesh))

  return jax.tree_util.tree_map_with_path(one, state)


def advice(config, results, state_bytes: int, budget: float, mesh) -> list[str]:
  """What to change when a program does not fit (largest term first)."""
  out = []
  for r in results:
    if r.peak <= budget:
      continue
    over = (r.peak - budget) / GIB
    if r.name in ("rl_step", "logprobs") and packs(config):
      out.append(
        f"{r.name} is {over:.1f} GiB over ({r.temporaries / GIB:.1f} GiB temporaries): lower rl.micro_batch_tokens "
        f"(now {config.rl.micro_batch_tokens} tokens per packed micro-batch), set model.remat='full' (now "
        f"'{config.model.remat}') or add devices"
      )
    elif r.name == "rl_step" and r.temporaries > r.arguments:
      m = config.rl.micro_batches
      out.append(
        f"rl_step is {over:.1f} GiB over, mostly activations ({r.temporaries / GIB:.1f} GiB temporaries): raise "
        f"rl.micro_batches (now {m}; it must divide rl.batch_size), set model.remat='full' (now "
        f"'{config.model.remat}'), lower model.logprob_chunk (now {config.model.logprob_chunk} positions of "
        "float32 logits over the whole vocabulary per sequence) or lower sampling.max_new_tokens"
      )
    elif r.name in ("prefill", "decode"):
      out.append(
        f"{r.name} is {over:.1f} GiB over: the KV cache grows with rl.batch_size x (prompt + rl.num_samples x "
        "sampling.max_new_tokens); sample fewer rows at once or add devices on the batch axes"
      )
    else:
      out.append(f"{r.name} is {over:.1f} GiB over: raise rl.micro_batches or add devices")
  if state_bytes > 0.6 * budget:
    out.append(
      f"the train state alone takes {state_bytes / GIB:.1f} of {budget / GIB:.0f} GiB per device: shard it over "
      f"more devices on mesh axis 'fsdp' (now {dict(mesh.shape)})" + lora_advice(config)
    )
  return out


def format_plan(result: dict) -> str:
  lines = [
    f"model {result['model']['params'] / 1e9:.2f}B params on {result['devices']} x {result['device_kind']}, "
    f"mesh {result['mesh']}",
    "batch: {prompts} prompts x G {samples} in {micro_batches} micro-batches, prompt {prompt_tokens} + "
    "completion {completion} tokens".format(**result["batch"]),
    f"model FLOPs per RL update: {result['update_model_tflop']:.1f} TFLOP"
    + (
      f" (~{result['update_s_at_40pct_mfu']:.1f} s per update at 40% MFU on this chip)"
      if result["update_s_at_40pct_mfu"]
      else ""
    ),
    f"train state per device: {result['train_state_gib_per_device']:.2f} GiB "
    f"(params {result['params_gib_per_device']:.2f} GiB)",
    format_breakdown(result["train_state_parts"]),
    "",
    f"{'program':<10}{'args':>9}{'temp':>9}{'out':>9}{'aliased':>9}{'other state':>13}{'peak':>9}{'compile':>10}",
  ]
  for r in result["programs"]:
    gib = lambda k: f"{r[k] / GIB:9.2f}"
    lines.append(
      f"{r['name']:<10}{gib('arguments')}{gib('temporaries')}{gib('outputs')}{gib('aliased')}"
      f"{r['resident_outside'] / GIB:13.2f}{r['peak'] / GIB:9.2f}{r['compile_s']:9.1f}s"
    )
  verdict = "fits" if result["fits"] else "does NOT fit"
  lines += ["", f"peak {result['peak_gib']:.2f} GiB per device of {result['hbm_gib']:.0f} GiB: {verdict}"]
  lines += [f"  - {a}" for a in result["advice"]]
  if result["device_kind"] == "cpu":
    lines.append("(XLA:CPU figures: bf16 temporaries are kept in f32 there, so this is an upper bound)")
  return "\n".join(lines)


def _define_flags() -> dict:
  """The CLI's flags, defined only when run as a program (so importing jaxcap.plan next to jaxcap.launch works)."""
  return dict(
    config=config_flags.DEFINE_config_file("config", None, "Run config, e.g. configs/caprl.py:paper", lock_config=True),
    model=flags.DEFINE_string(
      "model", None, "qwen2.5-vl-3b | qwen2.5-vl-7b | tiny | mid, or a checkpoint directory (default: model.checkpoint)"
    ),
    topology=flags.DEFINE_string("topology", "cpu:8", "cpu:N or tpu:<chip>:<shape> (e.g. tpu:v5e:4x4)"),
    hbm=flags.DEFINE_float("hbm_gib", None, "memory per device, GiB (default: the TPU chip's; 80 for cpu:N)"),
    programs=flags.DEFINE_list("programs", "rl_step,logprobs,prefill,decode", "which programs to compile"),
    prompt_text=flags.DEFINE_integer("prompt_text_tokens", 48, "text tokens of a prompt besides its image tokens"),
    json=flags.DEFINE_string("json", None, "also write the plan as JSON to this path"),
  )


def main(argv, f: dict):
  del argv
  config = f["config"].value
  if config is None:
    raise app.UsageError("--config is required, e.g. --config=configs/caprl.py:paper")

  topology = f["topology"].value
  # the host runs on CPU whatever the target: a TPU target is only compiled for, never attached
  jax.config.update("jax_platforms", "cpu")
  if topology.startswith("cpu:"):
    n = int(topology.split(":")[1])
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={n}".strip()
  devices, chip_hbm = topology_devices(topology)
  hbm = f["hbm"].value or chip_hbm or 80.0
  result = plan(
    config, model_config(config, f["model"].value), devices, hbm, tuple(f["programs"].value), f["prompt_text"].value
  )
  result["topology"] = topology
  print(format_plan(result))
  if f["json"].value:
    Path(f["json"].value).write_text(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
  from jaxcap.config.cli import parse_flags

  app.run(functools.partial(main, f=_define_flags()), flags_parser=parse_flags)  # a bad --config.x value: exit 2
