"""The mechanics every update step shares: gradients accumulated over the leading micro-batch axis (memory
bounded by one micro-batch), and the one guarded optimizer update that applies them."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax

from jaxcap.models import lora
from jaxcap.models.qwen25vl import VisionInput
from jaxcap.models.vision import VisionLayout
from jaxcap.sharding import shard_like_params
from jaxcap.train.steps import guard, precision
from jaxcap.train.steps.state import TrainState


def micro(tree, i):
  return jax.tree.map(lambda x: x[i], tree)


def vision_input(pixel_values, layout):
  return None if pixel_values is None else VisionInput(pixel_values, layout)


def per_micro(layout: VisionLayout | None, num_micro: int) -> VisionLayout | None:
  """One layout per micro-batch [M, ...]: `layout` as is when it has the leading M axis, else shared by all."""
  if layout is None or layout.reverse_index.ndim == 2:  # a field every family's layout has
    return layout
  return jax.tree.map(lambda x: jnp.broadcast_to(x, (num_micro, *x.shape)), layout)


def accumulate(loss_fn: Callable, params, batches, weights: jax.Array, *, trains_base: bool = False):
  """Loss, metrics and grads of `loss_fn(params, micro_batch)` over the leading micro-batch axis (lax.scan),
  each micro-batch weighted by its share of `weights` [M] (e.g. its token count), so the result equals the
  whole batch's loss whatever M is. Gradients accumulate in float32. With LoRA adapters in `params`, the gradients
  are the adapters' only (the frozen base is a constant of the loss: `lora.split_trainable`); with `trains_base`
  (`TrainState.trains_base`) the base's only, the adapters held."""
  trainable, frozen = lora.split_trainable(params, trains_base)
  if frozen is not None:
    loss_fn = _on_trainable(loss_fn, frozen)
    params = trainable
  if jax.tree.leaves(batches)[0].shape[0] == 1:
    # One micro-batch: no loop, no zero-filled accumulator, and the weight f (1, or 0 for an all-masked batch)
    # enters as the backward pass's seed instead of a pass over every gradient (on XLA:CPU the loop copied every
    # gradient: 1-5% of an update's op time, benchmarks/where_time_goes.py). The loop's values: f * grad, f in {0, 1}.
    f = weights[0].astype(jnp.float32) / jnp.maximum(jnp.sum(weights), 1e-9)

    def weighted(p, mb):
      mb_loss, m = loss_fn(p, mb)
      return f * mb_loss, m

    (loss, metrics), grads = jax.value_and_grad(weighted, has_aux=True)(params, micro(batches, 0))
    metrics = jax.tree.map(lambda b: f * b.astype(jnp.float32), metrics)
    return loss, metrics, shard_like_params(jax.tree.map(lambda g: g.astype(jnp.float32), grads))
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  metric_shapes = jax.eval_shape(lambda p, b: loss_fn(p, b)[1], params, micro(batches, 0))
  zeros_m = jax.tree.map(lambda s: jnp.zeros(s.shape, jnp.float32), metric_shapes)
  zeros_g = shard_like_params(jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params))
  total = jnp.maximum(jnp.sum(weights), 1e-9)

  def body(carry, xs):
    loss, metrics, grads = carry
    mb, w = xs
    (mb_loss, m), g = grad_fn(params, mb)
    f = w / total
    return (
      loss + f * mb_loss,
      jax.tree.map(lambda a, b: a + f * b, metrics, m),
      shard_like_params(jax.tree.map(lambda a, b: a + f * b.astype(jnp.float32), grads, g)),
    ), None

  (loss, metrics, grads), _ = jax.lax.scan(
    body, (jnp.zeros((), jnp.float32), zeros_m, zeros_g), (batches, weights.astype(jnp.float32))
  )
  return loss, metrics, grads


def _on_trainable(loss_fn: Callable, frozen) -> Callable:
  return lambda trainable, mb: loss_fn(lora.join(trainable, frozen), mb)


def apply_update(
  state: TrainState,
  grads,
  optimizer: optax.GradientTransformation,
  master_update: str = "exact",
  loss: jax.Array | None = None,
  max_update_ratio: float = 0.0,
) -> tuple[TrainState, dict]:
  """One optimizer update; `master_update` says how it lands on bfloat16 params (jaxcap.train.steps.precision), with
  stochastic rounding drawing its bits from the state's key and step. Guarded (jaxcap.train.steps.guard): a step whose
  `loss`, gradients or update is non-finite, or whose update diverged, keeps the params and optimizer state (the
  step counter still advances, with the data position) and says so in metrics[guard.HEALTH]."""
  # with LoRA: the adapters (the base stays as it is), or with state.trains_base the base (the adapters held)
  trainable, frozen = lora.split_trainable(state.params, state.trains_base)
  updates, opt_state = optimizer.update(grads, state.opt_state, trainable)
  key = None if master_update == "exact" else precision.update_key(state.key, state.step)
  params = precision.apply_updates(trainable, updates, mode=master_update, key=key)
  metrics = {"grad_norm": optax.tree.norm(grads), "update_norm": optax.tree.norm(updates)}
  loss = jnp.zeros((), jnp.float32) if loss is None else loss
  health = guard.step_health(loss, metrics["grad_norm"], metrics["update_norm"], trainable, max_update_ratio)
  params, opt_state = guard.keep_if(health == 0, (params, opt_state), (trainable, state.opt_state))
  metrics[guard.HEALTH] = health
  return state.replace(step=state.step + 1, params=lora.join(params, frozen), opt_state=opt_state), metrics
