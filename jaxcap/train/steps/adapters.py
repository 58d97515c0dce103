"""A run's LoRA / QLoRA (`model.lora`): the adapters put on its student, and what its train state holds per device.

`with_run_lora` is the one place a run's model gets its adapters (the trainer's setup and `jaxcap.plan` call it, so
the plan compiles the programs the run executes); `state_breakdown` splits a train state's per-device bytes into the
frozen base, the trainable params, the optimizer moments and the KL reference, which the planner prints."""

from __future__ import annotations

import jax
from jaxcap.config.run import Run
import numpy as np
from flax import nnx

from jaxcap.models import lora

GIB = 2**30


def lora_rank(config: Run) -> int:
  """`model.lora.rank` (0: full fine-tuning)."""
  return int(config.model.lora.rank)


def trains_base(config: Run, phase: str) -> bool:
  """Whether `phase` trains the base rather than the adapters under LoRA: the embedded student's SFT (no
  `model.checkpoint`). That student has no pretrained base; its vision warm-up and SFT build the one the RL
  adapters then sit on (with B = 0 the adapters leave it as it is), so RL starts from the SFT policy and its KL
  reference, the base with the adapters off, is that policy exactly, as in full fine-tuning. A checkpoint's base
  never trains: its SFT trains the adapters."""
  return lora_rank(config) > 0 and phase == "sft" and not config.model.checkpoint


def with_run_lora(model: nnx.Module, config: Run) -> nnx.Module:
  """`model` with the adapters of `model.lora` (the base quantized per `weight_qtype`), or `model` itself with rank
  0. Works on abstract models too (inside `nnx.eval_shape`). Adapters are seeded from the run's seed."""
  if lora_rank(config) <= 0:
    return model
  block = config.model.lora
  return lora.apply_lora(
    model,
    rank=int(block.rank),
    alpha=float(block.alpha),
    targets=tuple(block.targets),
    vision=bool(block.vision),
    weight_qtype=str(block.weight_qtype),
    seed=int(config.seed),
  )


def saved_part(state, config: Run):
  """(what a checkpoint holds of TrainState `state`, the frozen base it leaves out or None). With LoRA on a
  checkpoint (`model.checkpoint`), the base is left out: a resume reads it again from that directory. The embedded
  student's base (built and vision-warmed by the run itself) is saved whole."""
  if lora_rank(config) <= 0 or not config.model.checkpoint:
    return state, None
  trainable, frozen = lora.split_trainable(state.params)
  return state.replace(params=trainable), frozen


def with_base(state, frozen):
  """The inverse of `saved_part`: the restored state with the frozen base put back."""
  return state if frozen is None else state.replace(params=lora.join(state.params, frozen))


def _bytes(x) -> int:
  shape = x.sharding.shard_shape(x.shape) if getattr(x, "sharding", None) is not None else x.shape
  return int(np.prod(shape)) * jax.dtypes.itemsize_bits(x.dtype) // 8  # int4 / nf4 values: half a byte


def state_breakdown(state, config: Run) -> dict:
  """GiB per device of a (possibly abstract, sharded) TrainState's parts: `base` (params that do not train: with
  LoRA the frozen, possibly quantized, weights; without, 0), `trainable` (the params the optimizer updates),
  `optimizer` (its moments), `reference` (a KL reference copy; with LoRA none, the base being the reference), the
  trainable param count and `kind` (full fine-tuning, LoRA r=.., QLoRA)."""
  trainable, frozen = lora.split_trainable(state.params)
  size = lambda tree: sum(_bytes(x) for x in jax.tree.leaves(tree)) / GIB if tree is not None else 0.0
  rank, kind = lora_rank(config), "full fine-tuning"
  if rank:
    q = config.model.lora.weight_qtype
    kind = f"LoRA r={rank}" + (f", base {q} (QLoRA)" if q else "")
  return {
    "kind": kind,
    "base": size(frozen),
    "trainable": size(trainable),
    "optimizer": size(state.opt_state),
    "reference": size(state.ref_params),
    "trainable_params": float(sum(int(np.prod(x.shape)) for x in jax.tree.leaves(trainable))),
  }


def format_breakdown(parts: dict) -> str:
  """One line of the plan: what the train state is made of, per device."""
  return (
    f"  {parts['kind']}: frozen base {parts['base']:.2f} GiB, trainable {parts['trainable']:.3f} GiB "
    f"({parts['trainable_params'] / 1e6:.1f}M params), optimizer {parts['optimizer']:.3f} GiB, "
    f"KL reference copy {parts['reference']:.2f} GiB"
  )


def lora_advice(config: Run, base_dtype: str | None = None) -> str:
  """The plan's advice clause when the train state is too large: adapters, or a quantized base. `base_dtype`: the
  dtype the planned base is held in (default: `model.param_dtype_name()`, the run's checkpoint)."""
  if lora_rank(config) <= 0:
    return (
      "; or train low-rank adapters on a frozen base (--config.model.lora.rank=16, optimizer state for the "
      "adapters only, no KL reference copy; --config.model.lora.weight_qtype=int8 also quantizes the base)"
    )
  base = ""
  if (base_dtype or config.model.param_dtype_name()) == "float32":  # a frozen base needs no float32 master copy
    why = "" if config.model.param_dtype == "float32" else ", the checkpoint's stored dtype (model.param_dtype='auto')"
    base = (
      "; or hold the frozen base in bfloat16 (--config.model.param_dtype=bfloat16: it is float32 now"
      f"{why}, twice the bytes)"
    )
  if not config.model.lora.weight_qtype:
    return base + "; or quantize the frozen base (--config.model.lora.weight_qtype=int8, or nf4 / int4: QLoRA)"
  return base
