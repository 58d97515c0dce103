"""The training program: optional vision warm-up, then each phase (SFT, RL) in turn, with held-out evaluation,
checkpoints that resume exactly, metrics and export. `Trainer` only composes what a run is built from (setup.py),
its programs (programs.py), its phases (phases.py) and its working directory (rundir.py)."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import jax
from jaxcap.config.run import Run
from flax import nnx

from jaxcap.config.cli import ConfigError
from jaxcap.host_memory import release_freed
from jaxcap.multihost import is_lead_process
from jaxcap.rewards.mix import build_reward
from jaxcap.rewards.pipeline import build_reward_pipeline
from jaxcap.train.shell.abort import ABORT_CLOSE_WAIT_S, bounded, close_judge
from jaxcap.train.rollouts.batching import Batcher
from jaxcap.train.rollouts.loader import record_loader
from jaxcap.train.steps.guard import StepGuard
from jaxcap.train.shell.heldout import HELDOUT_QA, HeldOutEval
from jaxcap.train.shell.integrity import CheckpointDamagedError
from jaxcap.train.logs.curves import plot_curves
from jaxcap.train.logs.metrics import MetricsWriter, StepLog, to_json
from jaxcap.train.shell.phases import Phase, run_phases
from jaxcap.train.steps.programs import RunPrograms, build_sampler
from jaxcap.train.logs.rollout_records import RolloutRecorder
from jaxcap.train.shell.rundir import RunDirectory
from jaxcap.train.shell.setup import build
from jaxcap.train.rollouts.size_groups import record_patches
from jaxcap.world import vision_warmup


class Trainer:
  """Runs one config in `config.workdir`, resuming from its latest checkpoint if there is one."""

  def __init__(self, config: Run):
    self.config = config
    self.rundir = RunDirectory(config)  # locks the workdir and checks a resume before anything is built
    try:
      self._build()
    except BaseException:
      self.abort()
      raise

  def _build(self) -> None:
    c = self.config
    self.setup = setup = build(c, self.rundir.path)
    self.graphdef, self.params0 = nnx.split(setup.model)
    self.programs = RunPrograms(c, self.graphdef)
    self.batcher = Batcher(setup.processor, c, setup.mesh)
    self.sampler = build_sampler(c, setup.model, setup.processor, self.programs.sampling(), self.batcher.bucket_steps)
    tokenizer = getattr(setup.processor, "tokenizer", setup.processor)
    tokenize = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]
    self.rewards = build_reward_pipeline(c, setup.judge, tokenize)
    lg = c.logging
    self.metrics = MetricsWriter(
      self.rundir.path, trackers=lg.trackers, config=c.to_dict(), project=lg.project, run_name=c.name,
      mlflow_uri=lg.mlflow_uri,
    )  # fmt: skip
    self.heldout = HeldOutEval(
      self.sampler,
      self.batcher,
      self.programs.sampling(temperature=0.0),
      None if c.judge.kind == "none" else build_reward(HELDOUT_QA, setup.judge),
      self.rewards.evaluation,
      setup.mesh,
      self.rundir.path,
      c.eval.batch_size,
      log=self.metrics.write,
    )
    self.summary: dict[str, Any] = {}
    self._record_sizes = None

  def run(self) -> dict:
    """Trains to the end and returns the summary. On any exception (or interrupt) the checkpoint being written is
    finished or removed and every worker stopped, all with bounded waits (`abort`), before it propagates."""
    try:
      return self._run()
    except BaseException:
      self.abort()
      raise

  def _run(self) -> dict:
    c = self.config
    phases = run_phases(self)
    if not phases:
      raise ConfigError("nothing to do: sft.steps and rl.steps are both 0; set --config.sft.steps or --config.rl.steps")
    resume = self.rundir.latest_step()
    params = self.params0
    if resume is None:
      self.rundir.record_config()
      self.metrics.reset()  # records of a run killed before its first checkpoint
      if c.vision_warmup.steps > 0 and not c.model.checkpoint:
        params = self.warm_up_vision(params)
    key = jax.random.key(int(c.seed))
    start = 0 if resume is None else [p.name for p in phases].index(self.rundir.meta(resume)["phase"])
    for phase in phases[start:]:
      state = phase.new_state(self, params, jax.random.fold_in(key, phase.index))
      meta = None
      if resume is not None:
        try:
          state, meta = self.rundir.restore(resume, state, phase.name)
        except CheckpointDamagedError as e:  # nothing has run yet: start again from the newest intact checkpoint
          self.rundir.set_aside(e)
          return self._run()
        self.rundir.record_config()
        self.summary.update(meta.get("summary", {}))
        self.metrics.truncate_after(phase.name, int(meta["step"]))
        if is_lead_process():
          print(
            f"resumed {phase.name} at step {meta['step']} from {self.rundir.checkpoints.manager.directory}", flush=True
          )
        resume = None
      records_changed = phase.begin(self, state)
      # Each step's images are decoded and processed on the loader's thread while the device runs the step before.
      loader = record_loader(
        self.setup.train_records,
        phase.batch_size,
        seed=int(c.seed) + phase.index,
        prepare=phase.update.prepare,
        sizes=self.record_sizes(),
        group=int(c.data.group_by_size),
      )
      if meta is not None:
        loader.set_state(meta["loader"])
      else:
        phase.evaluate_at_start(self, state, records_changed)
      loader = phase.attach(loader)
      try:
        state = self.run_phase(phase, state, loader)
      finally:  # bounded: a prefetch thread stuck in a bad record must not hold the process (or the error) up
        bounded(getattr(loader, "close", lambda: None), ABORT_CLOSE_WAIT_S, "the data loader")
      params = state.params
      self.evaluate(params, phase.name, phase.steps, tag="end")
    self.rundir.wait()
    self.finish(params)
    return self.summary

  def run_phase(self, phase: Phase, state, loader):
    """The phase's steps from `state.step` on: each step dispatched, the one before it logged, held-out
    evaluation and checkpoints at their cadence."""
    c, mesh = self.config, self.setup.mesh
    step_fn = phase.step_fn(self, state)
    check = self.step_guard().check
    self._log = log = StepLog(self.metrics, phase.name, phase.steps, int(state.step), is_lead_process(), check)
    for step in range(int(state.step), phase.steps):
      t0 = time.perf_counter()
      batch = next(loader)
      with jax.set_mesh(mesh):
        state, metrics = phase.update(step_fn, state, batch, phase.step_arg(self, step))
      # The step before is logged only now, after this one was dispatched: its metrics are ready or nearly (this
      # step's rollout waited for its update).
      log.defer(step, metrics, t0)
      done = step + 1
      evaluate = phase.eval_every and done % phase.eval_every == 0 and done < phase.steps
      save = (c.checkpoint.every and done % c.checkpoint.every == 0) or done == phase.steps
      if evaluate or save:
        log.flush()  # a checkpoint's records are written before it (a resumed run keeps those up to its step)
      if evaluate:
        self.evaluate(state.params, phase.name, done)
      if save:
        meta = {"phase": phase.name, "step": done, "loader": loader.get_state(), "summary": self.summary}
        self.rundir.save(phase.checkpoint_base + done, state, json.loads(to_json(meta)))
    log.close()
    return state

  def step_guard(self) -> StepGuard:
    """The phase's guard on its steps (`train` block): a refused step stops the run naming the last checkpoint."""
    directory = self.rundir.checkpoints.manager.directory

    def last_checkpoint():
      step = self.rundir.latest_step()
      return None if step is None else str(directory / str(step))

    warn = lambda line: print(line, file=sys.stderr, flush=True) if is_lead_process() else None
    return StepGuard.from_config(self.config.train, self.setup.model.cfg.text.vocab_size, last_checkpoint, warn)

  def rollout_recorder(self, stop_ids) -> RolloutRecorder:
    """The RL phase's rollout records (`logging` block; process 0 writes), mirrored to the trackers' tables."""
    recorder = RolloutRecorder.from_config(self.config, self.rundir.path, stop_ids, is_lead_process())
    recorder.sinks.append(self.metrics.log_rollouts)
    return recorder

  def warm_up_vision(self, params):
    """The embedded student's vision warm-up (`jaxcap.world.vision_warmup`), logged as phase "vision"."""
    c = self.config
    log = lambda step, m: self.metrics.write("vision", step, m)
    processor, mesh = self.setup.processor, self.setup.mesh
    params, metrics = vision_warmup.warm_up_embedded_student(
      c, self.graphdef, params, processor.vision_cfg, mesh, log=log, progress=is_lead_process()
    )
    if metrics:
      self.metrics.write("vision", c.vision_warmup.steps, metrics)
      self.summary["vision_warmup"] = metrics
      if is_lead_process():
        accuracy = ", ".join(f"{k.split('/')[1]}={v:.3f}" for k, v in metrics.items())
        print(f"vision warm-up, held-out accuracy on object cells: {accuracy}", flush=True)
    return params

  def record_sizes(self):
    """Vision patches per training record (image headers only) when steps are grouped by size, else None."""
    c, records = self.config, self.setup.train_records
    if int(c.data.group_by_size) <= 1:
      return None
    if self._record_sizes is None or len(self._record_sizes) != len(records):
      p = self.setup.processor
      self._record_sizes = record_patches(records, p.vision_cfg, p.video_cfg, image_size=int(c.data.image_size))
    return self._record_sizes

  def evaluate(self, params, phase: str, step: int, tag: str = ""):
    records = self.setup.eval_records[: self.config.eval.num_images]
    metrics, captions = self.heldout.evaluate(params, records, phase, step, tag)
    release_freed()  # on CPU, the sampler's freed buffers back before training goes on (jaxcap.host_memory)
    if tag and metrics:
      self.summary[f"{phase}_{tag}"] = metrics
      self.summary[f"{phase}_{tag}_samples"] = captions[:3]
    return metrics

  def finish(self, params) -> None:
    """Curves, the HF export and summary.json, then every part closed and the workdir released."""
    if is_lead_process() and self.config.logging.curves and self.metrics.path.exists():
      plot_curves(self.metrics.path, self.rundir.path / "curves.png")
    if self.config.export.hf or self.config.export.peft:
      self.rundir.export(params, self.graphdef, self.setup.processor)
    (self.rundir.path / "summary.json").write_text(to_json(self.summary, indent=2))
    self.rundir.finish(self._closers())

  def abort(self) -> None:
    """After an error: the progress bar's last line, then `RunDirectory.abort` (bounded waits, never raises)."""
    log = getattr(self, "_log", None)
    if log is not None:  # the progress bar's last line before the error, not after it
      bounded(log.progress.close, ABORT_CLOSE_WAIT_S, "the progress bar")
    self.rundir.abort(self._closers())

  def _closers(self):
    """(what, close) of the parts built so far, in the order they stop."""
    setup = getattr(self, "setup", None)
    part = lambda name: getattr(getattr(self, name, None), "close", None)
    return [
      ("the reward workers", part("rewards")),
      ("the judge", (lambda: close_judge(setup.judge)) if setup is not None else None),
      ("the batcher", part("batcher")),
      ("the metrics writers", part("metrics")),
    ]
