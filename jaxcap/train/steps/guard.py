"""Guards on every update step: a step whose loss, gradients or update is non-finite, or whose update diverged, is
never applied, and the run stops (or skips it) with one error naming the step; a collapsed policy is warned about.

Device side (inside the jitted step, pure): `step_health` is an int32 code, 0 for a step that may be applied, else
the code of the first bad quantity (`QUANTITIES`); `keep_if` selects the old state for a bad step (a `jnp.where`, so
a finite step's values are exactly those of an unguarded one). The code travels with the step's metrics under
`HEALTH`, so the host reads it in the one fetch it already makes (no extra sync).

Host side: `StepGuard.check(phase, step, row)` acts on it per `train.on_nonfinite` ('stop', or 'skip' with a budget
of `train.max_skips` in a row) and watches for collapse (gradient norm exactly 0, or the entropy within
`ENTROPY_TOLERANCE` of its maximum ln V, for `train.collapse_steps` steps in a row: one warning).
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Callable, Mapping

import jax
import jax.numpy as jnp
import optax

HEALTH = "guard/health"  # the step-metrics key of the code; the host drops it from the logged record
# What each non-zero code names: the first of them that went wrong, in the order the step computes them.
QUANTITIES = {1: "loss", 2: "gradients", 3: "update", 4: "update (diverged)"}
ENTROPY_TOLERANCE = 1e-3  # relative: entropy >= (1 - tol) ln V is "at its maximum" (a uniform policy)


def step_health(
  loss: jax.Array, grad_norm: jax.Array, update_norm: jax.Array, params, max_update_ratio: float
) -> jax.Array:
  """int32 [] code: 0 when the step may be applied; 1 non-finite loss, 2 non-finite gradients (their global norm),
  3 non-finite update, 4 diverged update (norm > `max_update_ratio` x the parameters' global norm; 0 = no check)."""
  conditions = [~jnp.isfinite(loss), ~jnp.isfinite(grad_norm), ~jnp.isfinite(update_norm)]
  if max_update_ratio > 0:
    conditions.append(update_norm > max_update_ratio * optax.tree.norm(params))
  return jnp.select(conditions, [jnp.int32(k) for k in range(1, len(conditions) + 1)], jnp.int32(0))


def keep_if(ok: jax.Array, new, old):
  """`new` where `ok` (bool []), else `old`, leaf by leaf (two pytrees of one structure)."""
  return jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, old)


def describe(quantity: str) -> str:
  """What went wrong with a refused step, in words, from its QUANTITIES entry."""
  if quantity.endswith("(diverged)"):
    return "diverged (update norm above train.max_update_ratio x the parameters' norm)"
  return f"non-finite {quantity}"


class NonFiniteError(RuntimeError):
  """A step the guard refused (non-finite or diverged) stopped the run. `phase`, `step` (1-based, as
  metrics.jsonl), `quantity` (QUANTITIES), `checkpoint`: the last good checkpoint's directory, or None."""

  def __init__(self, phase: str, step: int, quantity: str, checkpoint: str | None, skipped: int = 0):
    self.phase, self.step, self.quantity, self.checkpoint = phase, step, quantity, checkpoint
    what = describe(quantity)
    after = f" after {skipped} skipped steps in a row (train.max_skips)" if skipped else ""
    last = f"the last good checkpoint is {checkpoint}" if checkpoint else "no checkpoint was saved before it"
    super().__init__(
      f"{phase} step {step}: {what}{after}; the step was not applied and nothing after it was saved; {last}. "
      "Lower the learning rate (and rerun with --config.resume_changes=allow to continue from that checkpoint), "
      "or set --config.train.on_nonfinite=skip to skip such steps"
    )


@dataclasses.dataclass
class StepGuard:
  """Checks each logged step record (`check`), in step order. `last_checkpoint()`: the newest checkpoint's
  directory (or None); `max_entropy`: ln V of the policy (None: no entropy check)."""

  on_nonfinite: str = "stop"
  max_skips: int = 3
  collapse_steps: int = 20
  max_entropy: float | None = None
  last_checkpoint: Callable[[], str | None] = lambda: None
  warn: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)

  @classmethod
  def from_config(cls, train, vocab_size: int, last_checkpoint: Callable[[], str | None], warn) -> "StepGuard":
    """The guard a run's `train` block asks for, on a policy over `vocab_size` tokens."""
    return cls(
      train.on_nonfinite, train.max_skips, train.collapse_steps, max_entropy(vocab_size), last_checkpoint, warn
    )

  def __post_init__(self):
    self.skips = 0  # consecutive skipped steps
    self._flat = {"grad_norm": 0, "entropy": 0}  # consecutive steps at the collapse signature
    self._warned: set[str] = set()

  def check(self, phase: str, step: int, row: dict) -> tuple[dict, NonFiniteError | None]:
    """(the record to log, the error to raise once it is logged, or None). The record loses `HEALTH`; a refused
    step's gains "skipped": the quantity."""
    row = dict(row)
    code = int(row.pop(HEALTH, 0))
    if code:
      quantity = QUANTITIES[code]
      row["skipped"] = quantity
      self.skips += 1
      if self.on_nonfinite != "skip" or self.skips > self.max_skips:
        skipped = self.skips - 1 if self.on_nonfinite == "skip" else 0
        return row, NonFiniteError(phase, step, quantity, self.last_checkpoint(), skipped)
      self.warn(
        f"warning: {phase} step {step}: {describe(quantity)}; the step was skipped "
        f"({self.skips} of at most {self.max_skips} in a row, train.max_skips)"
      )
      return row, None
    self.skips = 0
    self._collapse(phase, step, row)
    return row, None

  def _collapse(self, phase: str, step: int, row: Mapping) -> None:
    signs = {"grad_norm": row.get("grad_norm") == 0.0}
    entropy = row.get("entropy")
    if self.max_entropy and isinstance(entropy, float):
      signs["entropy"] = entropy >= (1 - ENTROPY_TOLERANCE) * self.max_entropy
    for key, hit in signs.items():
      self._flat[key] = self._flat[key] + 1 if hit else 0
      if self.collapse_steps and self._flat[key] == self.collapse_steps and key not in self._warned:
        self._warned.add(key)
        what = (
          "the gradient norm has been exactly 0"
          if key == "grad_norm"
          else f"the policy's entropy has been at its maximum (ln V = {self.max_entropy:.3f}: a uniform output)"
        )
        self.warn(
          f"warning: {phase} step {step}: {what} for {self.collapse_steps} steps in a row (train.collapse_steps): "
          "the policy looks collapsed; check the learning rate and the rewards / targets"
        )


def max_entropy(vocab_size: int) -> float:
  """ln V: the entropy of a uniform policy over `vocab_size` tokens, nats."""
  return math.log(vocab_size)


def nonfinite_weights(params) -> tuple[int, int]:
  """(non-finite, all) floating-point weights of a params pytree: the check before an export."""
  leaves = [x for x in jax.tree.leaves(params) if jnp.issubdtype(x.dtype, jnp.floating)]
  bad = sum(int(jnp.sum(~jnp.isfinite(x))) for x in leaves)
  return bad, sum(int(x.size) for x in leaves)
