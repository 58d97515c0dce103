"""What a sampling run holds at its peak, estimated from the config before anything is loaded (bytes).

Used to fail before loading, with the numbers and the fix, where the machine could not hold the run (the kernel's
OOM killer gives no message). An estimate, not a bound. It counts the params at their dtype, 5% of them (the
allocator's slack), and

- building them (a sampler that owns its weights, `held`): the checkpoint is read straight into the decode layout,
  each leaf into its final buffer through a read buffer of 64 MiB, then the compiler's heap (0.5 GiB);
- running: the decode program's own copies (`decode_layout`: on CPU for few rows, XLA:CPU's float32 copy of one
  layer's bf16 weights, and unless `held` the row-block copy of the decoder kernels and an untied LM head), the KV
  cache (its attention layers': `TextConfig.kv_layers`), a hybrid decoder's recurrent states (Qwen3.5's linear
  layers: fixed bytes per row, `TextConfig.recurrent_bytes`), and the largest activations of one prefill (one vision block's attention scores and MLP, the decoder's MLP
  over the prompt, float32 logits).

On CPU the memory freed after building stays in the process (`host_memory.retain_on_cpu`) and serves running only
in part (a program's temporaries are one block, the freed leaves' holes smaller), so both are counted. Measured
against `jaxcap.caption` (docs/benchmarks-history.md): Qwen2.5-VL-3B's full shape, estimate 8.41 GiB, peak RssAnon 8.60
GiB; the 7B's, 17.87 against 18.00. The memory already in use when it is
compared (the runtime, the processor) is not counted: the available figure is read after it.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np

from jaxcap.models import row_blocks
from jaxcap.models.config import Qwen25VLConfig

GIB = 1024**3


@dataclasses.dataclass(frozen=True)
class Footprint:
  """Peak bytes of a sampling call, by part; `rows` x `slots` is the KV cache's shape; `recurrent`: the rows'
  recurrent states (a hybrid decoder's)."""

  params: int
  decode_layout: int
  kv_cache: int
  activations: int
  rows: int
  slots: int
  building: int = 0
  recurrent: int = 0

  @property
  def running(self) -> int:
    return self.decode_layout + self.kv_cache + self.recurrent + self.activations

  @property
  def total(self) -> int:
    return self.params + self.params // 20 + self.building + self.running

  def describe(self, dtype_name: str) -> str:
    g = lambda n: f"{n / GIB:.2f}"
    layout = f"decode layout {g(self.decode_layout)}, " if self.decode_layout else ""
    states = f"recurrent states {g(self.recurrent)}, " if self.recurrent else ""
    running = (
      f"running {g(self.running)}: {layout}KV cache {g(self.kv_cache)} for {self.rows} rows x {self.slots} slots, "
      f"{states}activations {g(self.activations)}"
    )
    building = f", building them {g(self.building)}" if self.building else ""
    return f"{g(self.total)} GiB (params {g(self.params)} in {dtype_name} and 5% slack{building}, {running})"


@functools.lru_cache(maxsize=4)
def param_sizes(cfg: Qwen25VLConfig) -> list[tuple[str, tuple[int, ...]]]:
  """(path, shape) of every param, from the model's abstract shapes (nothing allocated)."""
  from flax import nnx

  from jaxcap.models.families import family_of_config

  model_cls = family_of_config(cfg).model_cls
  state = nnx.state(nnx.eval_shape(lambda: model_cls(cfg, rngs=nnx.Rngs(0))), nnx.Param)
  flat = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(state))[0]
  return [(".".join(str(getattr(k, "key", k)) for k in path), tuple(leaf.shape)) for path, leaf in flat]


def sampling_footprint(
  cfg: Qwen25VLConfig,
  rows: int,
  prompt_tokens: int,
  max_new_tokens: int,
  vision_patches: int = 0,
  vision_segment: int | None = None,
  held: bool = True,
) -> Footprint:
  """The peak of sampling `rows` prompts of up to `prompt_tokens` tokens, each with one image or video of up to
  `vision_patches` patches (full attention over `vision_segment` of them at a time: a frame; default: all) for
  `max_new_tokens` tokens, with params in `cfg.param_dtype` and activations / cache in `cfg.dtype`. Batches are padded to a power of two rows, as the sampler's buckets are. `held`: the weights are held as the decode loop reads them (a sampler that owns them, `decode_layout`), else laid out per call (a trainer's params)."""
  rows = 1 << max(0, rows - 1).bit_length()
  pbytes, cbytes = np.dtype(cfg.param_dtype).itemsize, np.dtype(cfg.dtype).itemsize
  sizes = param_sizes(cfg)
  params = sum(int(np.prod(s)) for _, s in sizes) * pbytes
  layout = 0
  if row_blocks.applies(rows):
    # The decode program's own copies (its compiled temporaries at the 3B's widths, 2 rows: 0.30 GiB held, at 2
    # layers and at 36): for bf16 params, one layer's float32 convert at a time (XLA:CPU computes bf16 dots in
    # float32; `row_blocks.in_step`); weights not `held` in the decode layout, each decoder kernel in row blocks
    # (a transposed copy at the params' dtype) and an untied head's. A tied head is a reshape, and the embedding
    # rows a step reads are converted alone (`loop_program`).
    upcast = 4 if pbytes < 4 else 0
    kernels = sum(int(np.prod(s)) for p, s in sizes if decoder_param(p) and p.endswith("kernel"))
    head = sum(int(np.prod(s)) for p, s in sizes if p.startswith("lm_head"))
    layout = (0 if held else kernels + head) * pbytes + kernels // cfg.text.num_hidden_layers * upcast
  # the checkpoint read straight into the decode layout (`load_hf_checkpoint(layers_apart=True)`): every leaf read
  # into its final buffer in runs of the stored tensor (a 64 MiB read buffer beside it), decoder kernels and an
  # untied head as row blocks of the stored layout; then XLA compiling the unrolled prefill in the same heap (about
  # 0.5 GiB at Qwen2.5-VL-3B's depth: benchmarks/caption_phases.py)
  building = (64 + 512) * 2**20 if held else 0
  t, v = cfg.text, cfg.vision
  slots = prompt_tokens + max_new_tokens
  kv = 2 * t.kv_layers * rows * t.num_key_value_heads * t.head_dim * slots * cbytes
  segment = vision_patches if vision_segment is None else vision_segment
  frames = -(-vision_patches // segment) if segment else 0
  segment = 1 << max(0, segment - 1).bit_length() if segment else 0  # padded to a power of two
  scores = frames * segment * segment * v.num_heads * 4  # one full-attention block's float32 scores
  vision = rows * (scores + vision_patches * (4 * v.hidden_size + 2 * v.intermediate_size) * 4)
  decoder = rows * prompt_tokens * (4 * t.hidden_size + 3 * t.intermediate_size) * 4
  logits = 2 * rows * t.vocab_size * 4
  recurrent = rows * t.recurrent_bytes(cfg.dtype)
  return Footprint(params, layout, kv, max(vision, decoder) + logits, rows, slots, building, recurrent)


def decoder_param(path: str) -> bool:
  """Whether a param (its `param_sizes` path) is a decoder layer's: of the stack `layers`, or of a hybrid decoder's
  `linear_layers` / `attention_layers`."""
  return path.split(".", 1)[0] in ("layers", "linear_layers", "attention_layers")


class MemoryShortError(RuntimeError):
  """A run that would not fit the memory available, with the numbers and what would fit."""


def check_fits(
  cfg: Qwen25VLConfig,
  available: tuple[int, str] | None,
  *,
  rows: int,
  prompt_tokens: int,
  max_new_tokens: int,
  vision_patches: int = 0,
  vision_segment: int | None = None,
  what: str = "sampling",
  rows_flag: str = "--batch_size",
) -> Footprint:
  """The run's `sampling_footprint`; raises MemoryShortError (one line: the estimate by part, the memory available
  and where that figure comes from, and the fixes that would fit: `--dtype bfloat16`, fewer rows (a smaller
  `rows_flag`), more devices) when it exceeds `available` ((bytes, source) from `host_memory.available_memory`;
  None: no check)."""
  import jax.numpy as jnp

  from jaxcap.host_memory import BUDGET

  size = lambda c, r: sampling_footprint(c, r, prompt_tokens, max_new_tokens, vision_patches, vision_segment)
  need = size(cfg, rows)
  if available is None or need.total <= available[0]:
    return need
  budget, source = available
  fixes = []
  if np.dtype(cfg.param_dtype) != np.dtype(jnp.bfloat16):
    bf16 = size(cfg.replace(param_dtype=jnp.bfloat16, dtype=jnp.bfloat16), rows)
    if bf16.total < need.total:  # not always on CPU: the decode loop's float32 copies of bf16 weights
      fixes.append(f"--dtype bfloat16 ({bf16.total / GIB:.2f} GiB)")
  halves = [rows >> k for k in range(1, rows.bit_length()) if rows >> k]  # the sampler pads rows to powers of two
  smaller = next((r for r in halves if size(cfg, r).total <= budget), None)
  if smaller is not None:
    fixes.append(f"{rows_flag} {smaller} ({size(cfg, smaller).total / GIB:.2f} GiB)")
  fixes.append("a mesh of more devices or a machine with more memory")
  raise MemoryShortError(
    f"{what} needs about {need.describe(np.dtype(cfg.param_dtype).name)}, but {budget / GIB:.2f} GiB is available "
    f"({source}); use {' or '.join(fixes)}, or set {BUDGET}=off to skip this check"
  )
