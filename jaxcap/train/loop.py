"""The training program: optional vision warm-up, SFT, then RL (sample -> judge -> advantages -> update), with
held-out evaluation, checkpoints that resume exactly, metrics and export. The imperative shell around the pure
steps in step.py; what a run is built from is setup.py, one update of each phase is updates.py."""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from jaxcap.checkpoint import save_hf_checkpoint
from jaxcap.locking import lock_workdir
from jaxcap.judges.budget import judged_reward
from jaxcap.multihost import is_lead_process
from jaxcap.rewards.families import REWARD_FAMILIES, RLStart
from jaxcap.rewards.length_mask import LengthMaskedReward
from jaxcap.rewards.mix import build_reward
from jaxcap.rewards.overlap import OverlappedReward
from jaxcap.rl import PolicyLossConfig
from jaxcap.sampling import Sampler, SamplingConfig
from jaxcap.world import vision_warmup
from jaxcap.train.abort import (
  ABORT_CHECKPOINT_WAIT_S,
  ABORT_CLOSE_WAIT_S,
  bounded,
  close_judge,
  remove_partial_checkpoints,
)
from jaxcap.train.batching import Batcher
from jaxcap.train.checkpointing import RunCheckpointer
from jaxcap.train.data import record_loader
from jaxcap.train.heldout import HELDOUT_QA, HeldOutEval
from jaxcap.train.metrics import MetricsWriter, plot_curves, to_json
from jaxcap.train.setup import build
from jaxcap.train.state import phase_train_state
from jaxcap.train import resume as resume_check
from jaxcap.train.step import rl_step, sequence_logprobs, sft_step
from jaxcap.train.updates import RLUpdate, SFTUpdate


class Trainer:
  """Runs one config in `config.workdir`, resuming from its latest checkpoint if there is one."""

  def __init__(self, config: ml_collections.ConfigDict):
    self.config = config
    self.workdir = Path(config.workdir)
    self.workdir.mkdir(parents=True, exist_ok=True)
    # one trainer per workdir (per process of a multi-host run), held until finish() / abort() or process exit
    self.lock = lock_workdir(self.workdir, jax.process_index())
    try:
      self.ckpt = RunCheckpointer(self.workdir / "checkpoints", max_to_keep=config.checkpoint.max_to_keep)
      self._check_resume()  # before build(): a changed world must not be regenerated under the saved loader state
      self._build()
    except BaseException:
      self.abort()
      raise

  def _check_resume(self) -> None:
    """Compares the config with the one saved in the workdir; raises ConfigChangedError on refused changes."""
    latest = self.ckpt.latest_step()
    position = None
    if latest is not None:
      meta = self.ckpt.meta(latest)
      position = resume_check.Position(str(meta["phase"]), int(meta["step"]), int(latest))
    self._resume_notes = resume_check.check(self.config, self.workdir, position)
    if is_lead_process():
      for line in self._resume_notes:
        print(line, file=sys.stderr, flush=True)

  def _record_config(self) -> None:
    """Saves the config as the run's (<workdir>/config.json): at a fresh start, or once a checkpoint restored under
    it, so a refused or failed resume leaves the saved config as it was."""
    if is_lead_process():
      resume_check.record(self.config, self.workdir, self._resume_notes)

  def _build(self) -> None:
    c = self.config
    self.setup = setup = build(c, self.workdir)
    self.graphdef, self.params0 = nnx.split(setup.model)
    self.batcher = Batcher(setup.processor, c, setup.mesh)
    s = c.sampling
    sampling = SamplingConfig(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, max_new_tokens=s.max_new_tokens)
    self.sampler = Sampler(
      setup.model,
      processor=setup.processor,
      sampling=sampling,
      length_multiple=c.data.pad_to_multiple,
      bucket_steps=self.batcher.bucket_steps,
    )
    reward = build_reward(c.reward.to_dict(), setup.judge)
    if c.rl.length_mask.dims:  # BalCapRL's mask, on the reward RL optimises and evaluation reports
      lm = c.rl.length_mask
      reward = LengthMaskedReward(reward, list(lm.dims), tau_low=lm.tau_low, tau_high=lm.tau_high)
    # judges: the failure budget stops the run when too few judgments are valid (judge.min_valid_fraction)
    self.reward = OverlappedReward(judged_reward(reward, setup.judge, c.judge))
    self.metrics = MetricsWriter(self.workdir)
    self.heldout = HeldOutEval(
      self.sampler,
      self.batcher,
      dataclasses.replace(sampling, temperature=0.0),
      build_reward(HELDOUT_QA, setup.judge),
      reward,
      setup.mesh,
      self.workdir,
      c.eval.batch_size,
      log=self.metrics.write,
    )
    self.summary: dict[str, Any] = {}

  def phases(self) -> list[tuple[str, int, int, Any]]:
    """(name, steps, batch size, optimiser config) of each phase with steps > 0, in order."""
    return [
      (p, self.config[p].steps, self.config[p].batch_size, self.config[p].optim)
      for p in ("sft", "rl")
      if self.config[p].steps > 0
    ]

  def new_state(self, phase, steps, optim, params, key):
    """(optimizer, TrainState) for a phase of `steps` updates, every leaf committed to its sharding on the mesh."""
    c = self.config
    frozen = ("visual",) if c[phase].freeze_vision else ()
    with_reference = phase == "rl" and c.rl.loss.kl_coef > 0
    return phase_train_state(optim, steps, params, key, self.setup.mesh, frozen=frozen, with_reference=with_reference)

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
    phases = self.phases()
    if not phases:
      raise ValueError("nothing to do: sft.steps and rl.steps are both 0")
    resume = self.ckpt.latest_step()
    params = self.params0
    if resume is None:
      self._record_config()
      self.metrics.reset()  # records of a run killed before its first checkpoint
      if c.vision_warmup.steps > 0 and not c.model.checkpoint:
        params = self.warm_up_vision(params)
    key = jax.random.key(int(c.seed))
    start = 0 if resume is None else [p[0] for p in phases].index(self.ckpt.meta(resume)["phase"])
    for i, (phase, steps, batch_size, optim) in enumerate(phases[start:], start):
      opt, state = self.new_state(phase, steps, optim, params, jax.random.fold_in(key, i))
      meta = None
      if resume is not None:
        state, meta = self._restore(resume, state, phase)
        self._record_config()
        self.summary.update(meta.get("summary", {}))
        self.metrics.truncate_after(phase, int(meta["step"]))
        if is_lead_process():
          print(f"resumed {phase} at step {meta['step']} from {self.ckpt.manager.directory}", flush=True)
        resume = None
      records_changed = phase == "rl" and self.before_rl(state)
      update = self.phase_update(phase)
      # Each step's images are decoded and processed on the loader's thread while the device runs the step before.
      loader = record_loader(
        self.setup.train_records,
        batch_size,
        seed=int(c.seed) + i,
        prepare=update.prepare,
        sizes=self.record_sizes(),
        group=int(c.data.group_by_size),
      )
      if meta is not None:
        loader.set_state(meta["loader"])
      elif phase == "rl" and "sft_end" in self.summary and not records_changed:
        # same params and records as the SFT phase's end: reuse its eval
        self.summary["rl_start"] = self.summary["sft_end"]
        self.summary["rl_start_samples"] = self.summary.get("sft_end_samples", [])
        self.metrics.write(phase, 0, self.summary["rl_start"])
      elif (phase == "rl" and c.eval.get("at_rl_start", True)) or (
        phase == "sft" and int(state.step) == 0 and c.eval.at_start
      ):
        self.evaluate(state.params, phase, 0, tag="start")
      try:
        state = self.run_phase(phase, i, steps, state, opt, update, loader)
      finally:  # bounded: a prefetch thread stuck in a bad record must not hold the process (or the error) up
        bounded(getattr(loader, "close", lambda: None), ABORT_CLOSE_WAIT_S, "the data loader")
      params = state.params
      self.evaluate(params, phase, steps, tag="end")
    self.ckpt.wait()
    self.finish(params)
    return self.summary

  def _restore(self, step, state, phase):
    try:
      return self.ckpt.restore(step, state)
    except Exception as e:  # Orbax names tree paths and shapes, not what in the config made them differ
      detail = str(e).strip().splitlines()[0][:300].rstrip(":") if str(e).strip() else type(e).__name__
      saved = self.workdir / resume_check.CONFIG_FILE
      started = f"the config saved in {saved}" if saved.exists() else "the config the run was started with"
      raise resume_check.ConfigChangedError(
        f"checkpoint {step} in {self.ckpt.manager.directory} does not fit the {phase} state this config builds "
        f"({type(e).__name__}: {detail}). The config changed the train state's structure (e.g. rl.loss.kl_coef "
        f"switched between 0 and > 0, {phase}.freeze_vision, the model's shapes); rerun with {started}, or start "
        "a separate run with a new --config.workdir."
      ) from e

  def warm_up_vision(self, params):
    params, metrics = vision_warmup.warm_up_embedded_student(
      self.config,
      self.graphdef,
      params,
      self.setup.processor.vision_cfg,
      self.setup.mesh,
      log=lambda step, m: self.metrics.write("vision", step, m),
    )
    if metrics:
      self.metrics.write("vision", self.config.vision_warmup.steps, metrics)
      self.summary["vision_warmup"] = metrics
      if is_lead_process():
        accuracy = ", ".join(f"{k.split('/')[1]}={v:.3f}" for k, v in metrics.items())
        print(f"vision warm-up, held-out accuracy on object cells: {accuracy}", flush=True)
    return params

  def before_rl(self, state) -> bool:
    """Runs the reward families' `before_rl` hooks (e.g. RubiCap writing rubrics against the policy entering RL);
    True when they changed the records."""
    s = self.setup
    changed = False
    for name in self.config.reward:
      hook = REWARD_FAMILIES[name].before_rl
      if hook is None:
        continue
      captions = lambda records, batch_size: self.heldout.captions(state.params, records, batch_size)[0]
      run = RLStart(self.config, self.workdir, s.judge, s.train_records, s.eval_records, captions, int(state.step))
      train, held_out = hook(run)
      changed |= train is not s.train_records or held_out is not s.eval_records
      s.train_records, s.eval_records = train, held_out
    return changed

  def record_sizes(self):
    """Vision patches per training record (image headers only) when steps are grouped by size, else None."""
    c = self.config
    if int(c.data.group_by_size) <= 1:
      return None
    if getattr(self, "_record_sizes", None) is None or len(self._record_sizes) != len(self.setup.train_records):
      from jaxcap.train.size_groups import record_patches

      processor = self.setup.processor
      self._record_sizes = record_patches(
        self.setup.train_records, processor.vision_cfg, processor.video_cfg, image_size=int(c.data.image_size)
      )
    return self._record_sizes

  def phase_update(self, phase):
    """The phase's update (`SFTUpdate` / `RLUpdate`): its `prepare` feeds the loader, its call runs a step."""
    c, s = self.config, self.setup
    if phase == "sft":
      return SFTUpdate(
        self.batcher,
        s.sft_targets,
        s.processor.tokenizer,
        s.model.cfg.eos_token_id,
        c.sft.micro_batches,
        c.sft.max_target_tokens,
      )
    return RLUpdate(
      self.batcher,
      self.sampler,
      self.reward,
      jax.jit(functools.partial(sequence_logprobs, self.graphdef)),
      c.rl.num_samples,
      c.rl.micro_batches,
      c.rl.recompute_old_logprobs,
    )

  def run_phase(self, phase, phase_index, steps, state, opt, update, loader):
    c, s = self.config, self.setup
    if phase == "sft":
      fn = functools.partial(sft_step, graphdef=self.graphdef, optimizer=opt, master_update=c.sft.optim.master_update)
    else:
      loss = PolicyLossConfig(max_gen_len=c.sampling.max_new_tokens, **c.rl.loss.to_dict())
      fn = functools.partial(
        rl_step,
        graphdef=self.graphdef,
        optimizer=opt,
        loss_config=loss,
        estimator=c.rl.estimator,
        master_update=c.rl.optim.master_update,
      )
    step_fn = jax.jit(fn, donate_argnums=0, out_shardings=(jax.tree.map(lambda x: x.sharding, state), None))
    progress = self._progress = _progress(steps, int(state.step), phase)  # abort() closes it on an error
    base = 0 if phase == "sft" else c.sft.steps
    pending = None  # (step, PendingMetrics, start time) of the last step run, not logged yet

    def log(end=None):
      """Logs the pending step: fetches its metrics (waiting for the device only if it is still busy with it)."""
      nonlocal pending
      if pending is None:
        return
      step, metrics, t0 = pending
      pending = None
      metrics = metrics.result()
      metrics["time/step_s"] = (time.perf_counter() if end is None else end) - t0
      self.metrics.write(phase, step + 1, metrics)
      progress.update(1)
      progress.set_postfix({k: f"{metrics[k]:.3f}" for k in ("loss", "reward/mean", "length/mean") if k in metrics})

    for step in range(int(state.step), steps):
      t0 = time.perf_counter()
      batch = next(loader)
      with jax.set_mesh(s.mesh):
        # SFT draws its targets from a generator seeded per step, so a resumed run replays them
        arg = np.random.default_rng([int(c.seed), phase_index, step]) if phase == "sft" else step
        state, metrics = update(step_fn, state, batch, arg)
      # The step before is logged only now, after this one was dispatched: its metrics are ready or nearly (this
      # step's rollout waited for its update), and fetching them never leaves the device idle.
      log(end=t0)
      pending = (step, metrics, t0)
      done = step + 1
      evaluate = c.eval.every and done % c.eval.every == 0 and done < steps and phase == "rl"
      save = (c.checkpoint.every and done % c.checkpoint.every == 0) or done == steps
      if evaluate or save:
        log()  # a checkpoint's records are written before it (a resumed run keeps those up to its step)
      if evaluate:
        self.evaluate(state.params, phase, done)
      if save:
        meta = {"phase": phase, "step": done, "loader": loader.get_state(), "summary": self.summary}
        self.ckpt.save(base + done, state, json.loads(to_json(meta)))
    log()
    progress.close()
    return state

  def evaluate(self, params, phase, step, tag=""):
    metrics, captions = self.heldout.evaluate(
      params, self.setup.eval_records[: self.config.eval.num_images], phase, step, tag
    )
    if tag and metrics:
      self.summary[f"{phase}_{tag}"] = metrics
      self.summary[f"{phase}_{tag}_samples"] = captions[:3]
    return metrics

  def finish(self, params):
    if is_lead_process() and self.metrics.path.exists():
      plot_curves(self.metrics.path, self.workdir / "curves.png")
    if self.config.export.hf:
      src = self.config.model.checkpoint or str(self.workdir / "tokenizer")
      # bf16-compute runs export bf16 (as released checkpoints are), not their f32 master weights
      dtype = jnp.bfloat16 if self.config.model.dtype == "bfloat16" else None
      save_hf_checkpoint(nnx.merge(self.graphdef, params), self.workdir / "export", tokenizer_dir=src, dtype=dtype)
      if is_lead_process():
        self.setup.processor.save_prompt_settings(self.workdir / "export")
    (self.workdir / "summary.json").write_text(to_json(self.summary, indent=2))
    self.reward.close()
    self.batcher.close()
    close_judge(self.setup.judge)
    self.metrics.close()
    self.ckpt.close()
    self.lock.release()

  def abort(self) -> None:
    """After an error: waits (bounded) for the checkpoint being written so it is complete, or removes its
    temporary directory; stops the reward workers, the judge's client, the batcher and the metrics writers; releases
    the workdir. Never raises; what it could not do is one warning line each."""
    progress = getattr(self, "_progress", None)
    if progress is not None:  # its last line before the error, not after it
      bounded(progress.close, ABORT_CLOSE_WAIT_S, "the progress bar")
    ckpt = getattr(self, "ckpt", None)
    if ckpt is not None:
      if not bounded(ckpt.wait, ABORT_CHECKPOINT_WAIT_S, "the checkpoint being saved"):
        remove_partial_checkpoints(Path(ckpt.manager.directory))
    setup = getattr(self, "setup", None)
    closers = [
      ("the reward workers", getattr(getattr(self, "reward", None), "close", None)),
      ("the judge", (lambda: close_judge(setup.judge)) if setup is not None else None),
      ("the batcher", getattr(getattr(self, "batcher", None), "close", None)),
      ("the metrics writers", getattr(getattr(self, "metrics", None), "close", None)),
      ("the checkpoint manager", getattr(ckpt, "close", None)),
    ]
    for what, close in closers:
      if close is not None:
        bounded(close, ABORT_CLOSE_WAIT_S, what)
    self.lock.release()


def _progress(total, initial, desc):
  from tqdm.auto import tqdm

  return tqdm(total=total, initial=initial, desc=desc, disable=not is_lead_process(), dynamic_ncols=True)
