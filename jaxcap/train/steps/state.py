"""Train state and optimizer: a pytree of (step, params, optimizer state, frozen reference params, PRNG key)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxcap.models import lora
from jaxcap.sharding import param_shardings, reshard, warn_replicated
from jaxcap.config.training import Optim
from jaxcap.train.steps.precision import float32_state


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
  """Everything a run needs to continue bit-for-bit: `step` int32 scalar, `params` (nnx.State of the policy; with
  LoRA the frozen base and the adapters), `opt_state` (of the trainable params: with LoRA the adapters only),
  `ref_params` (frozen copy for the KL term, or None; with LoRA None, the reference being the base) and the run's
  PRNG `key`. `trains_base` (static): with LoRA adapters in `params`, the base trains and the adapters are held
  (the embedded student's SFT, which warms the base RL's adapters then sit on); else the adapters train."""

  step: jax.Array
  params: Any
  opt_state: Any
  ref_params: Any
  key: jax.Array
  trains_base: bool = dataclasses.field(default=False, metadata=dict(static=True))

  def replace(self, **changes) -> "TrainState":
    return dataclasses.replace(self, **changes)


def learning_rate_schedule(
  lr: float,
  total_steps: int,
  warmup_ratio: float = 0.0,
  warmup_steps: int = 0,
  schedule: str = "cosine",
  end_lr_ratio: float = 0.0,
) -> optax.Schedule:
  """Linear warm-up (`warmup_steps`, or `warmup_ratio` of `total_steps`) then cosine / linear / constant."""
  warmup = warmup_steps or int(round(warmup_ratio * total_steps))
  decay_steps = max(total_steps - warmup, 1)
  if schedule == "cosine":
    after = optax.cosine_decay_schedule(lr, decay_steps, alpha=end_lr_ratio)
  elif schedule == "linear":
    after = optax.linear_schedule(lr, lr * end_lr_ratio, decay_steps)
  elif schedule == "constant":
    after = optax.constant_schedule(lr)
  else:
    raise ValueError(f"optim.schedule={schedule!r}; choose 'cosine', 'linear' or 'constant'.")
  if warmup == 0:
    return after
  return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup), after], [warmup])


def _decay_mask(params):
  """Weight decay on matrices only (not on norms, biases)."""
  return jax.tree.map(lambda x: x.ndim >= 2, params)


def make_optimizer(optim: Optim, total_steps: int, *, frozen: tuple[str, ...] = ()) -> optax.GradientTransformation:
  """AdamW with global-norm clipping and a warm-up + decay schedule, from a phase's `optim` block (the schema's
  `Optim`: one declaration of every optimizer knob), over `total_steps` updates. Parameters under the top-level
  names in `frozen` (e.g. "visual", the vision tower) get zero updates and no optimizer state. The state (Adam's
  moments) is float32 whatever the params' dtype, fixed from init (`precision.float32_state`)."""
  o = optim
  sched = learning_rate_schedule(o.lr, total_steps, o.warmup_ratio, o.warmup_steps, o.schedule)
  tx = optax.chain(
    optax.clip_by_global_norm(o.grad_clip) if o.grad_clip > 0 else optax.identity(),
    optax.adamw(
      sched, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay, mask=_decay_mask, mu_dtype=jnp.float32
    ),
  )
  if not frozen:
    return float32_state(tx)
  label = lambda path, _: "frozen" if _top_name(path) in frozen else "train"
  return float32_state(
    optax.multi_transform(
      {"train": tx, "frozen": optax.set_to_zero()}, lambda params: jax.tree_util.tree_map_with_path(label, params)
    )
  )


def _top_name(path) -> str:
  k = path[0]
  return str(getattr(k, "key", getattr(k, "name", k)))


def init_train_state(
  params,
  optimizer: optax.GradientTransformation,
  key: jax.Array,
  with_reference: bool = False,
  mesh=None,
  trains_base: bool = False,
) -> TrainState:
  """A fresh state around `params` (kept as they are). The optimizer state and the reference copy are created
  directly in their shardings on `mesh` (the params' rules, `train_state_shardings`): one jitted init with
  out_shardings, so no process ever holds, or fetches, a global array. `trains_base`: see `TrainState`."""
  state_fn = lambda p, k: _fresh_state(p, optimizer, k, with_reference, trains_base)
  if mesh is None:
    return jax.jit(state_fn)(params, key)
  shardings = train_state_shardings(jax.eval_shape(state_fn, params, key), mesh)
  params = reshard(params, shardings.params)
  make = jax.jit(
    lambda p, k: (optimizer.init(trainable(p, trains_base)), jax.tree.map(jnp.copy, p) if with_reference else None),
    out_shardings=(shardings.opt_state, shardings.ref_params),
  )
  opt_state, ref = make(params, key)
  scalars = jax.jit(lambda k: (jnp.zeros((), jnp.int32), k), out_shardings=(shardings.step, shardings.key))
  step, key = scalars(key)
  return TrainState(step, params, opt_state, ref, key, trains_base)


def _fresh_state(params, optimizer, key, with_reference, trains_base) -> TrainState:
  ref = jax.tree.map(jnp.copy, params) if with_reference else None
  opt_state = optimizer.init(trainable(params, trains_base))
  return TrainState(jnp.zeros((), jnp.int32), params, opt_state, ref, key, trains_base)


def trainable(params, trains_base: bool = False):
  """The params the optimizer updates: all of them, or with LoRA the adapters only (with `trains_base`, the base
  only; `jaxcap.models.lora.split_trainable`)."""
  return lora.split_trainable(params, trains_base)[0]


def train_state_shardings(abstract_state: TrainState, mesh) -> TrainState:
  """NamedShardings of every leaf of a (possibly abstract) TrainState: params, both Adam moments, the reference
  params and the gradients' layout all follow the params' logical rules (`jaxcap.sharding.param_shardings`);
  scalars (step, counts, key) are replicated."""
  replicated = NamedSharding(mesh, P())
  by_rule = lambda tree: param_shardings(tree, mesh)
  return TrainState(
    step=replicated,
    params=by_rule(abstract_state.params),
    opt_state=by_rule(abstract_state.opt_state),
    ref_params=None if abstract_state.ref_params is None else by_rule(abstract_state.ref_params),
    key=replicated,
    trains_base=abstract_state.trains_base,
  )


def phase_train_state(
  optimizer: optax.GradientTransformation, params, key, mesh, *, with_reference: bool = False, trains_base: bool = False
):
  """A phase's fresh TrainState for `optimizer` (`jaxcap.train.steps.programs.phase_optimizer`) around `params`
  (`trains_base`: see `TrainState`).

  Every leaf is created in (or moved to) its sharding on `mesh`, so the jitted steps see the same argument
  signature on every call and compile once; large replicated leaves are reported (`warn_replicated`)."""
  with jax.set_mesh(mesh):
    state = init_train_state(params, optimizer, key, with_reference=with_reference, mesh=mesh, trains_base=trains_base)
  warn_replicated(state, mesh)
  return state
