"""Resuming a workdir with a changed config: the resolved config is saved as `<workdir>/config.json` at the first
start; a later start compares its own config against it before anything is built.

Changes fall in four kinds; each config field declares whether changing it is allowed, alters the run or changes
parameter shapes (its resume policy in the schema, jaxcap.config):
  allowed     do not alter what is trained: more steps, evaluation / checkpoint / export cadence, judge endpoints
              and concurrency, memory and layout knobs (remat, log-prob chunk, mesh), where processes meet.
  no effect   settings of a phase already finished (the vision warm-up once a checkpoint exists, SFT once RL began).
  alters      everything else (model, data, world, reward, estimator, optimiser, seed, batch shapes, number of
              processes): refused unless `--config.resume_changes=allow`.
  impossible  the checkpoint cannot continue under the change whatever the user wants (its phase no longer runs,
              SFT changed after it ended, fewer steps than done, the KL reference policy or frozen tower switched
              mid-phase, parameter shapes (policy "shape"), a synthetic world that would be regenerated under the
              saved loader position): always refused.
Accepted changes are appended to `<workdir>/config_changes.jsonl` and `config.json` is updated to the new config.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
from pathlib import Path

import jax
from jaxcap.config.run import Run

from jaxcap.config import schema
from jaxcap.config.model import held_param_dtype
from jaxcap.config.changes import ABSENT as _ABSENT, Change, diff, flatten
from jaxcap.fields import ALLOWED, ALTERS, SHAPE

CONFIG_FILE = "config.json"
CHANGES_FILE = "config_changes.jsonl"
# The runtime facts `resolved()` saves along with the config, and what changing them does.
RUNTIME = {"runtime.device_count": ALLOWED, "runtime.process_count": ALTERS}


class ConfigChangedError(ValueError):
  """The config differs from the one the workdir's run was started with, in a way that is refused."""


@dataclasses.dataclass(frozen=True)
class Position:
  """Where the latest checkpoint is: its phase, the step within that phase, and the global checkpoint step."""

  phase: str
  step: int
  global_step: int

  @property
  def sft_steps(self) -> int:
    """SFT's step count when the checkpoint was saved (RL checkpoints are numbered after SFT's steps)."""
    return self.global_step - self.step if self.phase == "rl" else self.step


def resolved(config: Run) -> dict:
  """The config as saved: every field (JSON types) plus the runtime facts that shape the run."""
  return {
    "config": json.loads(json.dumps(config.to_dict(), sort_keys=True, default=str)),
    "runtime": {"process_count": jax.process_count(), "device_count": jax.device_count()},
  }


def _phases(config) -> list[str]:
  return [p for p in ("sft", "rl") if getattr(config, p).steps > 0]


def _position_problems(config, saved: dict | None, position: Position) -> list[Change]:
  """Changes the checkpoint at `position` cannot take, judged from the config alone (also without a saved one)."""
  out = []
  phase, step = position.phase, position.step
  saved_config = (saved or {}).get("config", {})
  if phase not in _phases(config):
    out.append(
      Change(
        f"{phase}.steps",
        saved_config.get(phase, {}).get("steps", _ABSENT),
        getattr(config, phase).steps,
        f"the latest checkpoint is at {phase} step {step}, and {phase}.steps={getattr(config, phase).steps} would skip "
        f"that phase; keep --config.{phase}.steps >= {step}",
      )
    )
  elif getattr(config, phase).steps < step:
    out.append(
      Change(
        f"{phase}.steps",
        saved_config.get(phase, {}).get("steps", _ABSENT),
        getattr(config, phase).steps,
        f"the latest checkpoint is already at {phase} step {step}; keep --config.{phase}.steps >= {step}",
      )
    )
  if phase == "rl" and config.sft.steps != position.sft_steps:
    out.append(
      Change(
        "sft.steps",
        position.sft_steps,
        config.sft.steps,
        f"SFT ended at step {position.sft_steps} before the latest checkpoint (rl step {step}); keep "
        f"--config.sft.steps={position.sft_steps}",
      )
    )
  return out


def _kind(change: Change, config, position: Position) -> str:
  """'allowed', 'inert', 'alters' or 'impossible' (then `change.why` is set)."""
  key, phase = change.key, position.phase
  embedded_world = not config.data.train_manifest
  policy = RUNTIME.get(key) or schema.resume_policy(key)
  if policy == SHAPE:
    change.why = "the checkpoint's parameters have the old shapes"
    return "impossible"
  if embedded_world and (key == "seed" or (key.startswith("world.") and key != "world.eval_scenes")):
    change.why = "the synthetic training world would be regenerated under the checkpoint's data position"
    return "impossible"
  kl = lambda v: v is not _ABSENT and bool(v) and v > 0
  if phase == "rl" and key == "rl.loss.kl_coef" and kl(change.old) != kl(change.new):
    on = kl(change.new)
    change.why = (
      f"switches the KL term {'on' if on else 'off'} mid-RL: the checkpoint at rl step {position.step} "
      f"{'has no' if on else 'holds a'} reference policy; keep rl.loss.kl_coef "
      f"{'= 0' if on else '> 0 (any positive value)'}"
    )
    return "impossible"
  if key == f"{phase}.freeze_vision":
    change.why = f"the checkpoint's optimizer state {'has none' if change.old else 'has one'} for the vision tower"
    return "impossible"
  if policy == ALLOWED:
    o = getattr(config, phase).optim if key == f"{phase}.steps" else None
    if o is not None and (o.schedule != "constant" or o.warmup_ratio > 0):
      change.why = f"the {o.schedule} learning-rate schedule now spans {change.new} steps"
    return "allowed"
  if key.startswith("vision_warmup.") or (phase == "rl" and key.startswith("sft.")):
    return "inert"
  return "alters"


def check(config: Run, workdir: Path, position: Position | None) -> list[str]:
  """Raises ConfigChangedError when `config` may not continue the run in `workdir` (latest checkpoint at
  `position`, None without one); returns lines to print about what changed. Call before anything is built."""
  workdir = Path(workdir)
  path = workdir / CONFIG_FILE
  saved = json.loads(path.read_text()) if path.exists() else None
  if position is None:  # nothing to continue: a fresh start (or a restart before the first checkpoint)
    return []
  new = resolved(config)
  notes = []
  changes: list[Change] = []
  if saved is None:
    notes.append(
      f"note: {workdir} has checkpoints but no {CONFIG_FILE} (a workdir from before jaxcap saved it): this config "
      "cannot be compared with the run's; it is saved as the run's once the checkpoint restores under it"
    )
  else:
    changes = diff(saved, new, defaults=flatten(schema.defaults()), renamed=schema.renamed_keys())
    changes = [c for c in changes if not _same_param_dtype(c, config)]
  impossible = _position_problems(config, saved, position)
  impossible += _world_problems(config, workdir)
  by_kind: dict[str, list[Change]] = {"allowed": [], "inert": [], "alters": [], "impossible": []}
  for c in changes:
    if any(c.key == i.key for i in impossible):
      continue
    by_kind[_kind(c, config, position)].append(c)
  impossible += by_kind["impossible"]
  where = f"{workdir} (latest checkpoint: {position.phase} step {position.step}; saved config: {path})"
  if impossible:
    lines = [f"cannot resume the run in {where}: its checkpoint cannot continue under these changes:"]
    lines += [f"  {c}" for c in impossible]
    if by_kind["alters"]:
      lines.append("and these changes alter the run:")
      lines += [f"  {c}" for c in by_kind["alters"]]
    lines.append(
      "Rerun with the saved values, or start a separate run with a new --config.workdir "
      "(--config.resume_changes=allow does not apply to these)."
    )
    raise ConfigChangedError("\n".join(lines))
  if by_kind["alters"] and config.resume_changes != "allow":
    lines = [f"the config differs from the run's in {where}; these changes alter the run:"]
    lines += [f"  {c}" for c in by_kind["alters"]]
    lines.append(
      "To continue this run under them anyway, add --config.resume_changes=allow; to start a separate run, use "
      "a new --config.workdir; to resume as it was, drop the changes."
    )
    raise ConfigChangedError("\n".join(lines))
  if by_kind["alters"]:
    notes.append("resuming with changes that alter the run (--config.resume_changes=allow):")
    notes += [f"  {c}" for c in by_kind["alters"]]
  if by_kind["allowed"]:
    notes.append("resuming with changed settings that do not alter the run: " + "; ".join(map(str, by_kind["allowed"])))
  if by_kind["inert"]:
    notes.append("these changes have no effect (their phase is over): " + "; ".join(map(str, by_kind["inert"])))
  return notes


def _same_param_dtype(change: Change, config) -> bool:
  """Whether `change` spells model.param_dtype another way with the same effect: 'float32', saved when it was the
  default, and 'auto', the default since, hold the params in one dtype unless a LoRA base is stored narrower."""
  if change.key != "model.param_dtype" or _ABSENT in (change.old, change.new):
    return False
  m = config.model
  held = lambda v: held_param_dtype(v, m.lora.rank, m.checkpoint)
  return held(change.old) == held(change.new)


def _world_problems(config, workdir: Path) -> list[Change]:
  """The synthetic world on disk must be the one this config asks for: `embedded.build_world` regenerates a
  split whose stamp differs, which under a restored loader position would mix two datasets."""
  if config.data.train_manifest:
    return []
  from jaxcap.world.student import world_config

  stamp = workdir / "world" / "train" / "world.json"
  if not stamp.exists():
    return []
  want = {
    "scenes": config.world.train_scenes,
    "seed": int(config.seed),
    **dataclasses.asdict(world_config(config.world)),
  }
  have = json.loads(stamp.read_text())
  out = []
  for k in sorted(set(want) | set(have)):
    if want.get(k, _ABSENT) != have.get(k, _ABSENT):
      key = {"scenes": "world.train_scenes", "seed": "seed"}.get(k, f"world.{k}")
      out.append(
        Change(
          key,
          have.get(k, _ABSENT),
          want.get(k, _ABSENT),
          f"the synthetic training world in {stamp.parent} would be regenerated under the checkpoint's data position",
        )
      )
  return out


def record(config: Run, workdir: Path, notes: list[str]) -> None:
  """Saves the config as `<workdir>/config.json` (atomically) and, when it replaces a different one, appends what
  changed to `config_changes.jsonl`. Process 0 only."""
  workdir = Path(workdir)
  path = workdir / CONFIG_FILE
  new = resolved(config)
  old = json.loads(path.read_text()) if path.exists() else None
  if old is not None and {k: v for k, v in old.items() if k != "saved"} == new:
    return
  now = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
  if old is not None:
    changes = [str(c) for c in diff(old, new)]
    with open(workdir / CHANGES_FILE, "a") as f:
      f.write(json.dumps({"time": now, "changes": changes, "notes": notes}) + "\n")
  tmp = path.with_name(path.name + ".tmp")
  tmp.write_text(json.dumps({**new, "saved": now}, indent=2, sort_keys=True) + "\n")
  os.replace(tmp, path)
