"""A run's working directory over its whole life: the lock, the config record and resume check, the checkpoints
(restore errors in words), the export, and the bounded clean-up of a run that failed.

    run = RunDirectory(config)       # locks the workdir; refuses a resume under a changed config (ConfigChangedError)
    ...
    state, meta = run.restore(step, state, phase)
    run.save(global_step, state, meta)
    run.finish(params, graphdef, processor, closers)  # or run.abort(closers) after an error
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from jaxcap.config.run import Run
from flax import nnx

from jaxcap.checkpoint import save_hf_checkpoint
from jaxcap.checkpoint.peft import save_peft_adapters
from jaxcap.models import lora
from jaxcap.processing.processor_files import save_processor_configs
from jaxcap.train.steps.adapters import saved_part, with_base
from jaxcap.locking import lock_workdir
from jaxcap.multihost import first_process_then_others, is_lead_process
from jaxcap.train.shell import integrity
from jaxcap.train.shell import resume as resume_check
from jaxcap.train.shell.abort import ABORT_CHECKPOINT_WAIT_S, ABORT_CLOSE_WAIT_S, bounded, remove_partial_checkpoints
from jaxcap.train.shell.checkpointing import RunCheckpointer
from jaxcap.train.steps.guard import nonfinite_weights

Closer = tuple[str, Callable[[], Any] | None]  # (what it closes, for the warning line; close function or None)


class RunDirectory:
  """`config.workdir`, locked for this process until `finish` / `abort` (or process exit).

  Construction checks a resumed run's config against the saved one before anything is built (a changed world must
  not be regenerated under the saved loader state); the config is recorded at a fresh start, or once a checkpoint
  restored under it, so a refused or failed resume leaves the saved config as it was."""

  def __init__(self, config: Run):
    self.config = config
    self.path = Path(config.workdir)
    self.path.mkdir(parents=True, exist_ok=True)
    self.lock = lock_workdir(self.path, jax.process_index())
    try:
      # before the checkpoint manager lists the steps: a damaged one is not a config change, and is not resumed
      notes = first_process_then_others(self._set_aside_unreadable, "jaxcap: checkpoint integrity")
      self._open(notes)
    except BaseException:
      self.abort()
      raise

  def _open(self, notes: list[str], printed: Sequence[str] = ()) -> None:
    """Opens the checkpoint manager, checks a resume against the latest step and prints `notes` and the check's
    (but those already `printed`)."""
    self.checkpoints = RunCheckpointer(self.path / "checkpoints", max_to_keep=self.config.checkpoint.max_to_keep)
    self._print([n for n in notes if n not in printed])
    self._notes = notes + resume_check.check(self.config, self.path, self.position())
    self._print([n for n in self._notes[len(notes) :] if n not in printed])

  @staticmethod
  def _print(lines: Sequence[str]) -> None:
    if is_lead_process():
      for line in lines:
        print(line, file=sys.stderr, flush=True)

  # -- damaged checkpoints -----------------------------------------------------------------------------------

  def _set_aside_unreadable(self) -> list[str]:
    """Moves aside each newest checkpoint whose files cannot be read (jaxcap.train.shell.integrity) until an intact one
    is the latest; returns a note for each."""
    damaged = []
    for step_dir in integrity.step_dirs(self.path / "checkpoints"):
      why = integrity.problems(step_dir)
      if not why:
        break
      damaged.append((step_dir, "; ".join(why)))
    return self._moved(damaged)

  def _moved(self, damaged: Sequence[tuple[Path, str]]) -> list[str]:
    """Moves each (checkpoint directory, why it cannot be read) aside; a note for each, saying where it went and
    which checkpoint the run resumes from."""
    moved = [(d, why, integrity.set_aside(d, self.path)) for d, why in damaged]
    left = integrity.step_dirs(self.path / "checkpoints")
    then = f"resuming from checkpoint {left[0].name}" if left else "no checkpoint is left: the run starts over"
    return [
      f"note: checkpoint {d.name} in {d.parent} cannot be read ({why}); moved it to {to}; {then}"
      for d, why, to in moved
    ]

  def set_aside(self, error: integrity.CheckpointDamagedError) -> None:
    """After a restore found checkpoint `error.step` damaged: moves it aside and reopens the run at the newest
    remaining checkpoint (checking the config against that one)."""
    self.checkpoints.close()
    note = first_process_then_others(
      lambda: self._moved([(error.directory, error.why)] if error.directory.exists() else []),
      "jaxcap: damaged checkpoint",
    )
    self._open(note, printed=self._notes)

  # -- where the run stands ----------------------------------------------------------------------------------

  def latest_step(self) -> int | None:
    """The global step of the latest checkpoint, or None at a fresh start."""
    return self.checkpoints.latest_step()

  def meta(self, step: int) -> dict:
    return self.checkpoints.meta(step)

  def position(self) -> resume_check.Position | None:
    latest = self.latest_step()
    if latest is None:
      return None
    meta = self.meta(latest)
    return resume_check.Position(str(meta["phase"]), int(meta["step"]), int(latest))

  def record_config(self) -> None:
    """Saves the config as the run's (<workdir>/config.json), with the accepted changes of a resume."""
    if is_lead_process():
      resume_check.record(self.config, self.path, self._notes)

  # -- checkpoints -------------------------------------------------------------------------------------------

  def save(self, step: int, state: Any, meta: dict) -> None:
    """Checkpoint `step`: the whole state, or with LoRA on a checkpoint's base the state less its frozen base
    (`adapters.saved_part`: the base is read again from model.checkpoint on resume, never rewritten)."""
    self.checkpoints.save(step, saved_part(state, self.config)[0], meta)

  def restore(self, step: int, state: Any, phase: str) -> tuple[Any, dict]:
    """The checkpoint at `step` in the shardings of `state` (its frozen LoRA base kept from `state`), and its meta;
    a state that does not fit is a ConfigChangedError saying what in the config changes the state's structure."""
    state, frozen = saved_part(state, self.config)
    # before the restore: a failing one's abandoned reads can report from Orbax's threads while its error is raised
    integrity.quiet_abandoned_reads()
    try:
      restored, meta = self.checkpoints.restore(step, state)
      return with_base(restored, frozen), meta
    except Exception as e:  # Orbax names tree paths and shapes, not what in the config made them differ
      detail = str(e).strip().splitlines()[0][:300].rstrip(":") if str(e).strip() else type(e).__name__
      step_dir = Path(self.checkpoints.manager.directory) / str(step)
      if integrity.fits(step_dir, state):  # the saved tree is the one this config builds: its data is damaged
        raise integrity.CheckpointDamagedError(step, step_dir, integrity.read_error(e)) from e
      saved = self.path / resume_check.CONFIG_FILE
      started = f"the config saved in {saved}" if saved.exists() else "the config the run was started with"
      raise resume_check.ConfigChangedError(
        f"checkpoint {step} in {self.checkpoints.manager.directory} does not fit the {phase} state this config "
        f"builds ({type(e).__name__}: {detail}). The config changed the train state's structure (e.g. "
        f"rl.loss.kl_coef switched between 0 and > 0, {phase}.freeze_vision, the model's shapes); rerun with "
        f"{started}, or start a separate run with a new --config.workdir."
      ) from e

  def wait(self) -> None:
    """Blocks until the last checkpoint is on disk."""
    self.checkpoints.wait()

  # -- the end -----------------------------------------------------------------------------------------------

  def export(self, params, graphdef, processor) -> None:
    """The policy as an HF checkpoint in <workdir>/export (export.hf; with the tokenizer, prompt and image / video
    processor settings it was trained with, `processor_files.save_processor_configs`; bf16-compute runs export
    bf16, as released checkpoints are, not their f32 master weights) and the LoRA adapters alone in
    <workdir>/export_adapters (export.peft), each on its own."""
    bad, total = nonfinite_weights(params)
    if bad:  # the step guard keeps training finite; this catches weights that started out broken
      raise ValueError(
        f"refusing to export to {self.path / 'export'}: {bad} of {total} weights are not finite (NaN or inf)"
      )
    c = self.config
    src = c.model.checkpoint or str(self.path / "tokenizer")
    dtype = jnp.bfloat16 if c.model.dtype == "bfloat16" else None
    model = nnx.merge(graphdef, params)
    if c.export.hf:
      save_hf_checkpoint(model, self.path / "export", tokenizer_dir=src, dtype=dtype)
      if is_lead_process():  # prompted and preprocessed as in training, by jaxcap and by transformers
        processor.save_prompt_settings(self.path / "export")
        save_processor_configs(processor, self.path / "export", square_side=int(c.data.image_size))
    if c.export.peft and lora.has_adapters(params):  # the adapters alone, for PEFT / vLLM on the base
      save_peft_adapters(model, self.path / "export_adapters", base_model=c.model.checkpoint)

  def finish(self, closers: Sequence[Closer]) -> None:
    """Closes the run's parts (in order), the checkpoint manager, and releases the workdir."""
    for _, close in closers:
      if close is not None:
        close()
    self.checkpoints.close()
    self.lock.release()

  def abort(self, closers: Sequence[Closer] = ()) -> None:
    """After an error: waits (bounded) for the checkpoint being written so it is complete, or removes its
    temporary directory; closes the run's parts and the checkpoint manager, each wait bounded; releases the
    workdir. Never raises; what it could not do is one warning line each."""
    checkpoints = getattr(self, "checkpoints", None)
    if checkpoints is not None:
      if not bounded(checkpoints.wait, ABORT_CHECKPOINT_WAIT_S, "the checkpoint being saved"):
        remove_partial_checkpoints(Path(checkpoints.manager.directory))
    for what, close in [*closers, ("the checkpoint manager", getattr(checkpoints, "close", None))]:
      if close is not None:
        bounded(close, ABORT_CLOSE_WAIT_S, what)
    self.lock.release()
