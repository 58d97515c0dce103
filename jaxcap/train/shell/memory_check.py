"""Whether a training run fits the host's memory, checked from the config before the checkpoint is read.

On CPU the weights, the train state and the rollouts all live in host memory, and a run that does not fit is
killed by the kernel's OOM killer minutes into loading, with no message. `check_train_memory` counts what the run
must hold at once, from the checkpoint's config.json and the run config (nothing is allocated):

- the params at `model.param_dtype` (a QLoRA base's targeted kernels at 1 byte (int8) or half a byte (int4 / nf4));
- the trainable params' float32 gradients and their two AdamW moments (all params, or LoRA's adapters only);
- the KL reference copy (`rl.loss.kl_coef` > 0 without LoRA);
- an RL step's rollouts: one prefill per prompt (`jaxcap.sampling.footprint` for `rl.batch_size` rows, less the
  params it counts again) and the KV cache of `rl.num_samples` completions per prompt (its attention layers'; a
  hybrid decoder's linear states per completion besides);
- the RL update's temporaries (its activations and gradients): XLA's own memory analysis of the run's update
  program, compiled ahead of time with abstract weights (`update_temporaries`: the rows of a pass
  (rl.batch_size x rl.num_samples / rl.micro_batches), the longest prompt + sampling.max_new_tokens, model.remat),
  so longer captions, larger batches and no remat are counted before anything is loaded.

The rollouts and the update's temporaries are never held at once, so the larger of the two counts. The figure is
what the run needs at least (the runtime, the compiler and the data come on top), so a run over it cannot fit. The
cheap parts are checked first: a run they already rule out is refused without compiling. Skipped off CPU (the
state lives on the accelerators) unless `JAXCAP_MEMORY_BUDGET` is set; `JAXCAP_MEMORY_BUDGET=off` skips it
anywhere.

The paged rollout engine's page pool against one device: `jaxcap.train.shell.pool_memory`.
"""

from __future__ import annotations

import dataclasses
import os

import jax
from jaxcap.config import schema
from jaxcap.config.model import Lora
from jaxcap.config.run import Run
import numpy as np

from jaxcap.config.cli import ConfigError
from jaxcap.host_memory import BUDGET, available_memory
from jaxcap.processing.vision import smart_resize
from jaxcap.sampling.footprint import param_sizes, sampling_footprint
from jaxcap.train.steps.abstract import abstract_rl_update
from jaxcap.train.steps.programs import with_reference

GIB = 1024**3
QTYPE_BYTES = {"int8": 1.0, "int4": 0.5, "nf4": 0.5}
PROMPT_TEXT = 64  # a prompt's text and chat template besides its image, tokens (roughly)


@dataclasses.dataclass(frozen=True)
class TrainFootprint:
  """Bytes a training run holds at once, by part (see the module docstring)."""

  params: int
  gradients: int
  moments: int
  reference: int
  rollouts: int
  update: int = 0  # the RL update's temporaries, XLA's count (they hold the gradients); 0: not counted
  update_shape: str = ""  # what they were counted at, e.g. "64 rows x 320 tokens a pass, remat none"

  @property
  def total(self) -> int:
    # the gradients and activations exist only inside the update, the rollouts' caches only while sampling
    return self.params + self.moments + self.reference + max(self.gradients, self.update, self.rollouts)

  def describe(self) -> str:
    parts = [f"params {size(self.params)}"]
    if self.update:
      parts += [f"the RL update's activations and gradients {size(self.update)} ({self.update_shape}, XLA's count)"]
    else:
      parts += [f"gradients {size(self.gradients)}"]
    parts += [f"AdamW moments {size(self.moments)}"]
    parts += [f"KL reference {size(self.reference)}"] if self.reference else []
    parts += [f"rollouts {size(self.rollouts)}"] if self.rollouts else []
    return f"{size(self.total)} ({', '.join(parts)})"


def size(n: float) -> str:
  """Bytes in the largest binary unit that keeps them >= 1 (GiB at most), two decimals."""
  unit = next((u for u in ("GiB", "MiB", "KiB") if n >= 1024 ** ("_KMG".index(u[0]))), "B")
  return f"{n / 1024 ** '_KMG'.index(unit[0]):.2f} {unit}" if unit != "B" else f"{int(n)} B"


def _adapted(path: str, lora: Lora) -> bool:
  """Whether the param at `path` (e.g. 'layers.self_attn.q_proj.kernel') is a kernel LoRA adapts."""
  parts = path.split(".")
  if parts[-1] != "kernel" or len(parts) < 2 or parts[-2] not in tuple(lora.targets):
    return False
  return parts[0] == "layers" or (bool(lora.vision) and parts[0] == "visual")


def train_footprint(config: Run, cfg, update: int = 0) -> TrainFootprint:
  """What the run of `config` on a model of `cfg` (the checkpoint's config at the run's dtypes) holds at once;
  `update`: the RL update's temporaries (`update_temporaries`), 0 to leave them out."""
  sizes = param_sizes(cfg)
  pbytes = np.dtype(cfg.param_dtype).itemsize
  count = lambda s: int(np.prod(s))
  lora = config.model.lora
  rank = int(lora.rank)
  if rank > 0:
    qbytes = QTYPE_BYTES.get(str(lora.weight_qtype), pbytes)
    adapted = [(p, s) for p, s in sizes if _adapted(p, lora)]
    params = sum(count(s) * pbytes for p, s in sizes if not _adapted(p, lora))
    params += int(sum(count(s) * qbytes for _, s in adapted))
    trainable = sum(count(s[:-2]) * rank * (s[-2] + s[-1]) for _, s in adapted)  # A [in, r], B [r, out]
    tbytes = 4  # adapters are float32 whatever the base
    params += trainable * tbytes
  else:
    trainable = sum(count(s) for _, s in sizes)
    tbytes = pbytes
    params = trainable * pbytes
  rl = config.rl
  reference = trainable * pbytes if rl.steps and with_reference(config, "rl") else 0
  rollouts = 0
  if rl.steps:  # one prefill per prompt (its KV shared by its G samples), then G completions' KV per prompt
    patches = image_patches(config, cfg)
    rows, new_tokens = int(rl.batch_size), int(config.sampling.max_new_tokens)
    prefill = sampling_footprint(
      cfg, rows, patches // cfg.vision.spatial_merge_size**2 + PROMPT_TEXT, 0, vision_patches=patches, held=False
    )
    t = cfg.text
    completions = 2 * t.kv_layers * rows * int(rl.num_samples) * t.num_key_value_heads * t.head_dim
    rollouts = prefill.total - prefill.params + completions * new_tokens * np.dtype(cfg.dtype).itemsize
    rollouts += rows * int(rl.num_samples) * t.recurrent_bytes(cfg.dtype)  # each completion's own linear states
  shape = update_shape(config) if update else ""
  return TrainFootprint(params, trainable * 4, 2 * trainable * tbytes, reference, rollouts, int(update), shape)


def update_shape(config: Run) -> str:
  """The RL update pass's rows and sequence length the check counts, and the remat policy, in words."""
  rl = config.rl
  rows = int(rl.batch_size) * int(rl.num_samples) // int(rl.micro_batches)
  return (
    f"{rows} completions of up to {int(config.sampling.max_new_tokens)} new tokens a pass, "
    f"model.remat={config.model.remat}"
  )


def update_temporaries(config: Run, cfg, mesh) -> int:
  """Host bytes of the RL update's temporaries (its activations and gradients): XLA's memory analysis of the run's
  own update program (`abstract_rl_update`: the trainer's jit, with the run's LoRA and remat), compiled ahead of
  time on `mesh` with abstract weights (nothing is read or allocated) at the run's batch and micro-batches, its
  largest image (`_image_grid`) + PROMPT_TEXT tokens of prompt and sampling.max_new_tokens; per device, times
  the mesh's devices on this host (CPU devices share its memory)."""
  cfg = cfg.replace(**config.model.compute())  # remat, scanned layers, log-prob chunks, dtypes: the run's
  update = abstract_rl_update(config, cfg, mesh, text=PROMPT_TEXT, grid=_image_grid(config, cfg))
  with jax.set_mesh(mesh):
    compiled = update.update.lower(*update.args).compile()
  return int(compiled.memory_analysis().temp_size_in_bytes) * len(mesh.local_devices)


def _image_grid(config: Run, cfg) -> tuple[int, int, int]:
  """Patch grid of the largest image a run feeds: `data.image_size` square, else one at the `data.max_pixels`
  budget; when neither is set (the checkpoint's own budget, unknown here) the smallest, one vision token, so that
  the count stays a floor."""
  v = cfg.vision
  factor = v.patch_size * v.spatial_merge_size
  side, budget = int(config.data.image_size), int(config.data.max_pixels)
  if side:
    h, w = smart_resize(side, side, factor)
  elif budget:
    h, w = smart_resize(int(budget**0.5), int(budget**0.5), factor, max_pixels=budget)
  else:
    h = w = factor
  return 1, h // v.patch_size, w // v.patch_size


def image_patches(config: Run, cfg) -> int:
  """Patches of the largest image a run feeds (`_image_grid`); 0 when the budget is unknown (rollouts then count
  text only)."""
  if not int(config.data.image_size) and not int(config.data.max_pixels):
    return 0
  return int(np.prod(_image_grid(config, cfg)))


def check_train_memory(config: Run, cfg, available: tuple[int, str] | None = None, mesh=None) -> None:
  """Raises ConfigError (one message: the run's footprint by part, the memory available and where that figure
  comes from, and settings that would fit) when the run cannot fit; on CPU only, or where `JAXCAP_MEMORY_BUDGET` is
  set. `available`: (bytes, source), default `host_memory.available_memory()`. With `mesh` (the learner's) and RL
  steps, the update's temporaries are counted too (`update_temporaries`, once the rest fits)."""
  if available is None:
    if jax.default_backend() != "cpu" and not os.environ.get(BUDGET):
      return
    available = available_memory()
    if available is None:
      return
  budget, source = available
  need = train_footprint(config, cfg)
  if need.total <= budget and mesh is not None and config.rl.steps:
    need = train_footprint(config, cfg, update_temporaries(config, cfg, mesh))
  if need.total <= budget:
    return
  # the update's own settings first where its activations are the largest part
  fixes = _update_knobs(config) if need.update > max(need.gradients, need.rollouts) else []
  for label, changes in _alternatives(config, cfg):
    trial = schema.replaced(config, changes)
    # the params' dtype under the change ('auto': LoRA holds a checkpoint's base in its stored dtype)
    trial_cfg = cfg.replace(param_dtype=jax.numpy.dtype(trial.model.param_dtype_name()))
    smaller = train_footprint(trial, trial_cfg, need.update).total  # the update's temporaries as they are
    if smaller < need.total:
      fixes.append(f"{label} ({size(smaller)})")
  fixes.append("a machine or mesh with more memory")
  raise ConfigError(
    f"this run needs at least {need.describe()}, but {size(budget)} is available ({source}); use "
    f"{' or '.join(fixes)}, or set {BUDGET}=off to skip this check"
  )


def _update_knobs(config: Run) -> list[str]:
  """The settings that shrink the RL update's activations, in words (each needs the update compiled again to
  count: the check names them without a figure)."""
  rl, knobs = config.rl, []
  if config.model.remat != "full":
    knobs.append("--config.model.remat=full (one saved activation per block)")
  if int(rl.batch_size) % (2 * int(rl.micro_batches)) == 0:
    knobs.append(f"--config.rl.micro_batches={2 * int(rl.micro_batches)} (half the rows a pass)")
  tokens = int(config.sampling.max_new_tokens)
  if tokens > 1:
    knobs.append(f"a lower --config.sampling.max_new_tokens (now {tokens}; the activations grow with it)")
  return knobs


def _alternatives(config: Run, cfg):
  """(flags, changes) that shrink the run, each tried alone against the footprint."""
  lora = config.model.lora
  if int(lora.rank) == 0:
    yield "--config.model.lora.rank=16", {"model.lora.rank": 16}
    wide = schema.replaced(config, {"model.lora.rank": 16}).model.param_dtype_name() == "float32"
    if np.dtype(cfg.param_dtype).itemsize > 2 and wide:  # not the checkpoint's bfloat16 already ('auto')
      yield (
        "--config.model.lora.rank=16 --config.model.param_dtype=bfloat16",
        {"model.lora.rank": 16, "model.param_dtype": "bfloat16"},
      )
  elif not str(lora.weight_qtype):
    yield "--config.model.lora.weight_qtype=int8", {"model.lora.weight_qtype": "int8"}
  if config.rl.steps and config.rl.loss.kl_coef > 0:
    yield "--config.rl.loss.kl_coef=0", {"rl.loss.kl_coef": 0.0}
  if config.rl.steps and int(config.rl.batch_size) > 1:
    half = int(config.rl.batch_size) // 2
    yield f"--config.rl.batch_size={half}", {"rl.batch_size": half}
