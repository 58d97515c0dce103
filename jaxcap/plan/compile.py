"""`plan`: the run's programs lowered and compiled ahead of time on a target's devices, with abstract weights, and
their per-device memory, compile time and FLOPs."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from jaxcap.models.families import layout_for
from jaxcap.models.flops import model_flops, param_counts, peak_tflops
from jaxcap.models.qwen25vl import VisionInput
from jaxcap.plan.inputs import decode_state_shardings, per_device_bytes, with_shardings
from jaxcap.plan.layout import Layout
from jaxcap.plan.report import GIB, advice
from jaxcap.sampling import generate
from jaxcap.sampling.prompts import Prompts, batch_bucket
from jaxcap.sharding import logical_to_spec
from jaxcap.train.steps.abstract import abstract_rl_update
from jaxcap.train.steps.adapters import state_breakdown
from jaxcap.train.steps.programs import packs, rollout_engine
from jaxcap.plan.engine import engine_inputs, engine_programs, engine_shards, slots_that_fit


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
  bytes_accessed: float = 0.0  # XLA's count per call (a loop's body once: a decode program's is per step)
  error: str = ""  # the compiler's refusal (a TPU target's temporaries over its HBM): the other figures are bounds

  @property
  def peak(self) -> int:
    return self.resident_outside + self.arguments + self.temporaries + self.outputs - self.aliased


def program_fingerprint(lowered) -> str:
  """sha256 of a lowered program's StableHLO text (what XLA compiles; no source locations)."""
  return hashlib.sha256(lowered.as_text().encode()).hexdigest()


def compile_or_refusal(lowered):
  """(the compiled program, "") or, where the compiler refuses it for memory (the TPU compiler does when temporaries
  exceed the chip's HBM), (None, its message) with the temporaries it asked for (bytes, 0 if unstated) parsed."""
  try:
    return lowered.compile(), "", 0
  except jax.errors.JaxRuntimeError as e:
    if "RESOURCE_EXHAUSTED" not in str(e):
      raise
    m = re.search(r"HLO temporaries \(([\d.]+)([KMGT])\)", str(e))
    scale = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    return None, str(e).splitlines()[0], int(float(m.group(1)) * scale[m.group(2)]) if m else 0


def plan(
  config, cfg, devices, hbm_gib: float, names=("rl_step", "logprobs", "prefill", "decode"), text=48, slices=None
):
  """Compiles the programs `names` for `config` (batch, mesh, sampling) and model `cfg` on `devices` (with
  rollout.devices, `slices`: the learner's and the rollouts' TPU slices); returns a dict."""

  placement = Layout.of(config, devices, slices)  # the learner's mesh, and the rollouts' (rollout.devices: their own)
  mesh = placement.learner
  # the trainer's own update (and model, with model.lora's adapters and any quantized base, as the run builds it)
  abstract = abstract_rl_update(config, cfg, mesh, text)
  graphdef, abstract_params, programs = abstract.graphdef, abstract.abstract_params, abstract.programs
  inputs = abstract.inputs
  state, rollouts = inputs.state, inputs.rollouts
  _, prompt_batch, _, layout = abstract.args  # packed: the step's PackedInputs, its prompts without pixels
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
  # rl.max_staleness = k, colocated: the next k steps' rounds (prompts and rollouts) are held through this step's
  # passes; on rollout devices of their own (rollout.devices) they wait there, and only this step's is copied over
  queued = per_device_bytes((inputs.prompts, rollouts.tokens, rollouts.mask, rollouts.old_logprobs))
  queued = queued * config.rl.max_staleness if not config.rollout.devices else 0
  params_bytes = per_device_bytes(params)
  rows = batch_bucket(prompts_total)
  sample_layout = layout_for(np.asarray([grid] * rows), cfg.vision)
  sync = placement.sync_bytes(config, params, cfg.dtype)  # a version's copy onto each rollout device (0 colocated)
  on_rollouts = placement.arr if placement.split else arr  # the sampler's prompts, where the rollouts run
  sample_prompts = Prompts(
    on_rollouts((rows, p), jnp.int32, ("batch", None)),
    on_rollouts((rows, p), jnp.bool_, ("batch", None)),
    on_rollouts((3, rows, p), jnp.int32, (None, "batch", None)),
    on_rollouts((rows,), jnp.int32, ("batch",)),
    VisionInput(on_rollouts((rows * patches, cfg.vision.patch_dim), jnp.float32, ("batch", None)), sample_layout),
  )
  gen_kw = programs.generation_statics(cfg, pad_id=0)

  results: list[ProgramPlan] = []
  engine_plan = None

  def compile_one(name, lower, args, resident_outside, on=mesh, record=True) -> ProgramPlan:
    """The program's figures, appended to `results` (`record`)."""
    t0 = time.perf_counter()
    with jax.set_mesh(on):
      lowered = lower(*args)
      compiled, error, temporaries = compile_or_refusal(lowered)
    seconds = time.perf_counter() - t0
    if compiled is None:  # refused for memory: recorded as not fitting, the other programs still planned
      row = ProgramPlan(name, per_device_bytes(args), 0, 0, temporaries, resident_outside, seconds, 0.0, error=error)
      row = dataclasses.replace(row, fingerprint=program_fingerprint(lowered))
    else:
      mem = compiled.memory_analysis()
      cost = compiled.cost_analysis()
      cost = cost[0] if isinstance(cost, (list, tuple)) else cost
      row = ProgramPlan(
        name,
        int(mem.argument_size_in_bytes),
        int(mem.output_size_in_bytes),
        int(mem.alias_size_in_bytes),
        int(mem.temp_size_in_bytes),
        resident_outside,
        seconds,
        float((cost or {}).get("flops", 0.0)),
        program_fingerprint(lowered),
        float((cost or {}).get("bytes accessed", 0.0)),
      )
    if record:
      results.append(row)
    return row

  if "rl_step" in names:
    compile_one("rl_step", abstract.update.lower, abstract.args, queued)
  if "logprobs" in names:
    lower = programs.logprobs().lower
    compile_one("logprobs", lower, (params, prompt_batch, layout, rollouts.tokens), state_bytes - params_bytes + queued)
  engine = rollout_engine(config)
  if engine is not None and {"prefill", "decode"} & set(names):  # the run's rollouts: the paged engine's programs
    # data parallel: each device runs its own engine over its block of the prompts, with the whole model (a copy in
    # the compute dtype, `PagedSampler`: the train state's own shard stays resident beside it)
    shards, one = engine_shards(placement.rollouts, rows), placement.first
    beside = sync if placement.split else state_bytes  # the next version arriving, or the train state's own shard
    ins = engine_inputs(config, cfg, params, graphdef, sample_prompts, g, devices[0].platform, one, shards)
    stop_ids = (int(cfg.eos_token_id),)
    lowerings = engine_programs(config, cfg, graphdef, programs.sampling(), g, stop_ids, devices[0].platform)
    engine_names = [name for name, old in (("paged_prefill", "prefill"), ("segment", "decode")) if old in names]
    peaks = {
      n: compile_one(n, lowerings[n], getattr(ins, n.removeprefix("paged_")), beside, on=one).peak for n in engine_names
    }
    fit = None
    if not config.rollout.pages:  # a pool sized by the slots: the same programs at twice the slots give the slope
      more = engine_inputs(
        config, cfg, params, graphdef, sample_prompts, g, devices[0].platform, one, shards, 2 * engine.slots
      )
      more_peaks = {
        n: compile_one(n, lowerings[n], getattr(more, n.removeprefix("paged_")), beside, one, False).peak
        for n in engine_names
      }
      fit = slots_that_fit(engine.slots, peaks, more_peaks, 2 * engine.slots, hbm_gib * GIB)
    engine_plan = dataclasses.asdict(dataclasses.replace(ins.plan, slots_fit=fit))
    names = tuple(n for n in names if n not in ("prefill", "decode"))
  if {"prefill", "decode"} & set(names):  # the static sampler, on the rollouts' mesh
    on, weights = placement.rollouts, placement.rollout_params(params, cfg.dtype)
    beside = sync if placement.split else state_bytes - params_bytes
    sample_key = jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=NamedSharding(on, logical_to_spec((), (), on)))
    prefill = functools.partial(generate.prefill_jit.lower, num_samples=g, **gen_kw)
    with jax.set_mesh(on):
      decode_state = jax.eval_shape(
        functools.partial(generate.prefill, num_samples=g, **gen_kw), weights, sample_prompts, sample_key
      )
    if "prefill" in names:
      compile_one("prefill", prefill, (weights, sample_prompts, sample_key), beside, on=on)
    if "decode" in names:
      decode_state = with_shardings(decode_state, decode_state_shardings(decode_state, on))
      decode = functools.partial(generate.decode_jit.lower, **gen_kw)
      compile_one("decode", decode, (weights, decode_state), beside, on=on)

  counts = param_counts(abstract_params)
  # the update's work as the run lays it out (each prompt once for its group, model.share_prompt) and repeated
  shape = dict(sequences=prompts_total * g, prompt=p, completion=c, images=prompts_total, patches_per_image=patches)
  shared = prompts_total if cfg.share_prompt and g > 1 else None
  flops = model_flops(cfg, counts, prompts=shared, **shape)
  repeated = model_flops(cfg, counts, **shape)
  chip_tflops = peak_tflops(getattr(devices[0], "device_kind", ""))
  peak = max((r.peak for r in results), default=state_bytes)
  budget = hbm_gib * GIB
  return {
    "model": {"params": sum(int(np.prod(x.shape)) for x in jax.tree.leaves(abstract_params))},
    "mesh": dict(mesh.shape),
    "devices": len(devices),
    "layout": placement.describe(),
    "weight_sync_gib": sync / GIB,
    "device_kind": getattr(devices[0], "device_kind", str(devices[0].platform)),
    "batch": {
      "prompts": prompts_total,
      "samples": g,
      "micro_batches": f"{abstract.packed_rows.shape[0]} packed" if packs(config) else config.rl.micro_batches,
      "prompt_tokens": p,
      "completion": c,
    },
    "image_grid": grid,
    "update_model_tflop": flops["total"] / 1e12,
    "update_decoder_tflop": {"as_run": flops["decoder"] / 1e12, "prompt_repeated": repeated["decoder"] / 1e12},
    "prompt_shared": shared is not None,
    "update_s_at_40pct_mfu": flops["total"] / mesh.size / (0.4 * chip_tflops * 1e12) if chip_tflops else None,
    "train_state_gib_per_device": state_bytes / GIB,
    "train_state_parts": state_breakdown(state, config),
    "queued_round_gib": queued / GIB,
    "params_gib_per_device": params_bytes / GIB,
    "programs": [dataclasses.asdict(r) | {"peak": r.peak} for r in results],
    "hbm_gib": hbm_gib,
    "peak_gib": peak / GIB,
    "fits": peak <= budget,
    "engine": engine_plan,
    "advice": advice(
      config, results, state_bytes, budget, mesh, (engine_plan or {}).get("slots_fit"), np.dtype(cfg.param_dtype).name
    ),
  }
