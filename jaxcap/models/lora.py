"""Low-rank adapters (LoRA) and QLoRA on the student, through qwix.

`apply_lora` gives each targeted `Linear` (by module name: the decoder's q/k/v/o and gate/up/down projections, and
with `vision` the vision tower's / merger's) qwix's LoRA interception: its kernel W [in, out] stays as it is (or,
with `weight_qtype`, is replaced by its quantized form, QLoRA) and the layer computes x W + (alpha / r) x A B with
adapters A [in, r] (He-uniform) and B [r, out] (zeros), both `nnx.LoRAParam` in float32. Zero B gives the base
model's outputs exactly. Stacked layers (a leading layer axis) get one adapter pair per layer, [L, in, r] and
[L, r, out]. The adapters' paths end `kernel_lora_a` / `kernel_lora_b`, which `jaxcap.sharding` lays out by the
kernel's own rule (A like the kernel's input axis, B like its output axis).

Only the adapters train: `split_trainable` separates them from the frozen base (a params state without adapters
trains whole), so gradients and optimizer state exist for the adapters alone (or, for a base the run warms itself,
the base alone with the adapters held at zero). The base policy is the same params
with B zeroed (`adapters_off`): the KL reference costs no copy. `merged` folds the adapters into the (dequantized)
kernels: a plain model that `save_hf_checkpoint` exports.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
from flax import nnx

from jaxcap.choices import LINEAR_ATTENTION_TARGETS, LORA_TARGETS, VISION_TARGETS, WEIGHT_QTYPES
from jaxcap.models.layers import Linear

__all__ = [
  "LINEAR_ATTENTION_TARGETS",
  "LORA_TARGETS",
  "VISION_TARGETS",
  "WEIGHT_QTYPES",
  "adapter_count",
  "adapters_off",
  "apply_lora",
  "has_adapters",
  "join",
  "merged_pure",
  "split_trainable",
]

_ADAPTER = re.compile(r"_lora_[ab]$")


def _targeted(path: tuple, targets: tuple[str, ...], vision: bool) -> bool:
  names = [str(p) for p in path]
  if not names or names[-1] not in targets:
    return False
  return vision or names[0] != "visual"


def apply_lora(
  model: nnx.Module,
  *,
  rank: int,
  alpha: float,
  targets: tuple[str, ...] = LORA_TARGETS,
  vision: bool = False,
  weight_qtype: str = "",
  seed: int = 0,
) -> nnx.Module:
  """`model` with qwix LoRA (and, with `weight_qtype` int8 / int4 / nf4, its targeted kernels quantized) on every
  `Linear` whose module name is in `targets` (vision tower's only with `vision`). Modifies `model` in place and
  returns it. Params of the adapters are created where the kernels live (no mesh sharding: callers reshard)."""
  import qwix  # imported here: only LoRA runs need it

  if rank <= 0:
    raise ValueError(f"model.lora.rank={rank}: apply_lora needs rank >= 1")
  if weight_qtype not in WEIGHT_QTYPES:
    raise ValueError(f"model.lora.weight_qtype={weight_qtype!r}; choose one of {WEIGHT_QTYPES}")
  provider = qwix.LoraProvider(
    module_path=".*", rank=rank, alpha=float(alpha), weight_qtype=weight_qtype or None, tile_size=None
  )
  found = [
    (path, m) for path, m in nnx.iter_modules(model) if isinstance(m, Linear) and _targeted(path, targets, vision)
  ]
  if not found:
    raise ValueError(f"model.lora.targets={list(targets)} match no Linear of the model (vision={vision})")
  for i, (path, lin) in enumerate(found):
    rngs = nnx.Rngs(jax.random.fold_in(jax.random.key(seed), i))
    din = lin.in_features
    if lin.kernel.ndim == 2:
      wrapped = qwix.apply_lora_to_model(lin, provider, jnp.zeros((1, din), lin.param_dtype), rngs=rngs)
    else:  # a layer stack: one adapter pair (and quantization) per layer, under vmap
      layers = lin.kernel.shape[0]

      @nnx.split_rngs(splits=layers)
      @nnx.vmap(in_axes=(0, 0), out_axes=0)
      def wrap(one, r):
        return qwix.apply_lora_to_model(one, provider, jnp.zeros((1, din), one.param_dtype), rngs=r)

      wrapped = wrap(lin, rngs)
    for name in ("kernel_lora_a", "kernel_lora_b"):  # float32 whatever the base's dtype (qwix takes the base's)
      setattr(wrapped, name, nnx.LoRAParam(getattr(wrapped, name)[...].astype(jnp.float32)))
    wrapped.lora_scale = float(alpha) / rank  # read by merged_pure
    parent = model
    for name in path[:-1]:
      parent = parent[name] if isinstance(name, int) else getattr(parent, name)
    setattr(parent, path[-1], wrapped)
  return model


def has_adapters(params) -> bool:
  """Whether a params state (or any pytree keyed like one) holds LoRA adapters."""
  return any(_ADAPTER.search(_key(_last_name(p))) for p, _ in _paths(params))


def adapter_count(params) -> int:
  """Number of adapter weights in `params`."""
  return sum(int(x.size) for p, x in _paths(params) if _ADAPTER.search(_key(_last_name(p))))


def split_trainable(params, base: bool = False):
  """(trainable, frozen) of an nnx params state: with adapters, the `nnx.LoRAParam`s and the rest (with `base`,
  the other way round: the base trains and the adapters are held, as the embedded student's SFT warms its own
  base); without adapters, the whole state and None."""
  if not has_adapters(params):
    return params, None
  adapters, rest = nnx.split_state(params, nnx.LoRAParam, ...)
  return (rest, adapters) if base else (adapters, rest)


def join(trainable, frozen):
  """The inverse of `split_trainable`."""
  return trainable if frozen is None else nnx.merge_state(trainable, frozen)


def adapters_off(params):
  """`params` with every adapter B zeroed: the base policy, exactly (x W + x A 0 = x W)."""
  return jax.tree_util.tree_map_with_path(
    lambda p, x: jnp.zeros_like(x) if _key(_last_name(p)).endswith("_lora_b") else x, params
  )


def merged_pure(model: nnx.Module) -> dict:
  """The params of `model` as a pure nested dict of arrays without adapters: every adapted kernel replaced by
  W + (alpha / r) A B (a quantized W dequantized first), in float32 arithmetic and the kernel's param dtype. The
  tree of the same model built without LoRA (what `save_hf_checkpoint` names)."""
  pure = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  for path, lin in nnx.iter_modules(model):
    if not isinstance(lin, Linear) or not hasattr(lin, "kernel_lora_a"):
      continue
    node = pure
    for name in path:
      node = node[name]
    a, b = (jnp.asarray(node.pop(k), jnp.float32) for k in ("kernel_lora_a", "kernel_lora_b"))
    w = _dequantized(node["kernel"]).astype(jnp.float32)
    node["kernel"] = (w + lin.lora_scale * jnp.matmul(a, b)).astype(lin.param_dtype)
  return pure


def _dequantized(kernel):
  """A kernel array, or qwix's quantized form of one ({'array': {'qvalue', 'scale'}}) dequantized to float32."""
  if not isinstance(kernel, dict):
    return jnp.asarray(kernel)
  q = kernel["array"]
  qvalue, scale = jnp.asarray(q["qvalue"]), jnp.asarray(q["scale"], jnp.float32)
  if qvalue.dtype == jnp.uint4:  # nf4: 4-bit indices into the NormalFloat code book
    from qwix._src.core import numerics

    qvalue = numerics.nf4_to_fp(qvalue)
  return qvalue.astype(jnp.float32) * scale


def _paths(tree):
  return jax.tree_util.tree_leaves_with_path(tree)


def _last_name(path):
  """The last key of a leaf path that names a field (skipping nnx's trailing `.value`)."""
  keys = [k for k in path if _key(k) != "value"]
  return keys[-1] if keys else path[-1]


def _key(k) -> str:
  return str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))))
