"""`Run`, the whole run config, and its smaller blocks: evaluation, checkpoints, export, the device mesh, multi-host.

Defaults describe the embedded default (synthetic world, tiny student, rule-based judge) that finishes on a laptop
CPU; each config file's `paper` variant sets the published hyper-parameters for a real Qwen2.5-VL.
"""

from __future__ import annotations

import dataclasses

from jaxcap.choices import NONFINITE_ACTIONS, RESUME_CHANGES
from jaxcap.fields import ALLOWED, Block, field
from jaxcap.config.judging import Judge, Rubrics
from jaxcap.config.model import Data, Model, World
from jaxcap.config.sampling import Rollout, Sampling
from jaxcap.config.training import Rl, Sft, VisionWarmup
from jaxcap.rewards.families import REWARD_FAMILIES
from jaxcap.sharding import MESH_AXES


def _evaluates(block, run) -> bool:
  return block.num_images > 0


@dataclasses.dataclass(frozen=True)
class Eval(Block):
  """Held-out evaluation. 256 images: on 64, greedy-caption flips moved held-out QA by about 4 points between
  checkpoints."""

  RESUME = ALLOWED

  every: int = field(25, "evaluate every this many steps", ge=0, hint="0 = only at phase ends")
  num_images: int = field(256, "held-out images evaluated", ge=0, hint="0 = no evaluation")
  batch_size: int = field(64, "images per evaluation batch", ge=1, when=_evaluates)
  at_start: bool = field(False, "evaluate before SFT")
  at_rl_start: bool = field(True, "evaluate before RL (False when many runs share one start, as experiments do)")


@dataclasses.dataclass(frozen=True)
class Checkpoint(Block):
  RESUME = ALLOWED

  every: int = field(25, "save every this many steps", ge=0, hint="0 = only at phase ends")
  max_to_keep: int = field(2, "checkpoints kept", ge=1, rule="must be >= 1, or the run cannot resume")


@dataclasses.dataclass(frozen=True)
class Export(Block):
  RESUME = ALLOWED

  hf: bool = field(True, "export the final policy as a Hugging Face checkpoint (with LoRA: merged)")
  peft: bool = field(False, "with LoRA: the adapters alone in PEFT's layout, in <workdir>/export_adapters")

  def check(self, run, at):
    if self.peft and not run.model.lora.rank:
      yield f"{at}peft=True exports LoRA adapters, but model.lora.rank=0 trains none; set model.lora.rank or {at}peft=False"


TRACKERS = ("tensorboard", "wandb", "mlflow")  # jaxcap.train.logs.trackers builds each


@dataclasses.dataclass(frozen=True)
class Logging(Block):
  """What a run records besides metrics.jsonl: rollout records for `python -m jaxcap.inspect`, and the experiment
  trackers that mirror the metrics (process 0 only)."""

  RESUME = ALLOWED

  rollouts_every: int = field(10, "write rollout records every this many RL steps", ge=0, hint="0 = never")
  rollout_groups: int = field(4, "groups per rollout record file (the step's best and worst always among them)", ge=1)
  rollout_max_chars: int = field(8000, "longest string kept in a rollout record (longer ones are cut)", ge=16)
  curves: bool = field(True, "write curves.png (reward, held-out QA and lengths vs step) when the run ends")
  trackers: list[str] = field(("tensorboard",), "experiment trackers: tensorboard, wandb, mlflow ([] = none)")
  project: str = field("jaxcap", "the W&B project / MLflow experiment")
  mlflow_uri: str = field("", "MLflow tracking URI; '' = MLFLOW_TRACKING_URI, else sqlite:///<workdir>/mlflow.db")

  def check(self, run, at):
    unknown = [t for t in self.trackers if t not in TRACKERS]
    if unknown:
      yield f"{at}trackers={list(self.trackers)}: unknown {unknown}; choose from {', '.join(TRACKERS)}"


@dataclasses.dataclass(frozen=True)
class Mesh(Block):
  RESUME = ALLOWED  # the layout only: a checkpoint is resharded on restore

  shape: dict[str, int] = field({"data": 1, "fsdp": -1, "tensor": 1}, "devices per mesh axis; -1 = the rest")

  def check(self, run, at):
    sizes = dict(self.shape)
    if set(sizes) - set(MESH_AXES):
      yield f"{at}shape={sizes}: unknown axes {sorted(set(sizes) - set(MESH_AXES))}; use {', '.join(MESH_AXES)}"
    if not all(v >= 1 or v == -1 for v in sizes.values()) or list(sizes.values()).count(-1) > 1:
      yield f"{at}shape={sizes}: each axis needs a size >= 1, or -1 (the remaining devices) on at most one axis"


@dataclasses.dataclass(frozen=True)
class Distributed(Block):
  """Where the processes meet (jax.distributed); how many there are is runtime.process_count (which alters the
  run, jaxcap.train.shell.resume.RUNTIME)."""

  RESUME = ALLOWED

  coordinator_address: str = field("", "host:port of process 0; '' = auto-detect (SLURM, TPU pods) or one process")
  num_processes: int = field(0, "processes in the run")
  process_id: int = field(-1, "this process's index")

  def check(self, run, at):
    if self.coordinator_address and not 0 <= self.process_id < self.num_processes:
      yield (
        f"{at}process_id={self.process_id}, num_processes={self.num_processes}: need 0 <= process_id < num_processes"
      )


@dataclasses.dataclass(frozen=True)
class Train(Block):
  """What a run does about an update step that goes wrong (jaxcap.train.steps.guard). A step whose loss, gradients or
  update is non-finite, or whose update diverged (its norm above `max_update_ratio` x the parameters' norm), is
  never applied: the run stops naming the step and the last good checkpoint, or skips it."""

  RESUME = ALLOWED  # guards only: a finite step is computed the same whatever they say

  on_nonfinite: str = field(
    "stop",
    "a non-finite or diverged step: 'stop' the run, or 'skip' it (not applied; max_skips in a row stop the run)",
    choices=NONFINITE_ACTIONS,
  )
  max_skips: int = field(3, "consecutive skipped steps before the run stops (on_nonfinite='skip')", ge=1)
  max_update_ratio: float = field(
    1.0,
    "an update whose norm exceeds this multiple of the parameters' norm is diverged (not applied)",
    ge=0,
    hint="0 = off; fine-tuning updates are ~1e-3 of the parameters' norm",
  )
  collapse_steps: int = field(
    20,
    "warn when the gradient norm is 0, or the policy's entropy at its maximum, for this many consecutive steps",
    ge=0,
    hint="0 = no warning",
  )


@dataclasses.dataclass(frozen=True)
class Run(Block):
  """A whole run config: one tree shared by every method's config file."""

  name: str = field("run", "the run's name in reports", resume=ALLOWED)
  seed: int = field(0, "every random draw: world, initialisation, sampling, data order")
  workdir: str = field("runs/run", "checkpoints, metrics, config.json; a rerun resumes from it", resume=ALLOWED)
  compile_cache: str = field(
    "compile_cache", "persistent XLA compilation cache, relative to the workdir (or absolute); '' = off", resume=ALLOWED
  )
  # Changes that do not alter the run (more steps, eval / checkpoint cadence, judge endpoints) are always allowed.
  resume_changes: str = field(
    "refuse",
    "resuming with a config that alters the run: 'refuse' (list the changes and stop) or 'allow'",
    choices=RESUME_CHANGES,
    rule="use 'refuse' (stop on changes that alter a resumed run) or 'allow'",
    resume=ALLOWED,
  )
  mesh: Mesh = field(Mesh(), "the device mesh")
  distributed: Distributed = field(Distributed(), "multi-host start")
  model: Model = field(Model(), "the policy")
  world: World = field(World(), "the synthetic world")
  vision_warmup: VisionWarmup = field(VisionWarmup(), "the embedded student's vision warm-up")
  data: Data = field(Data(), "manifests and image inputs")
  judge: Judge = field(Judge(), "the judge")
  reward: dict[str, dict] = field(
    {"caprl": {"weight": 1.0, "preset": "paper"}},
    "reward families by name: {family: {weight, options}}",
    choices=REWARD_FAMILIES,
  )
  rubrics: Rubrics = field(Rubrics(), "RubiCap rubrics")
  sampling: Sampling = field(Sampling(), "RL sampling")
  rollout: Rollout = field(Rollout(), "the engine generating RL rollouts")
  sft: Sft = field(Sft(), "supervised fine-tuning")
  rl: Rl = field(Rl(), "reinforcement learning")
  train: Train = field(Train(), "guards on every update step (non-finite / diverged / collapsed)")
  eval: Eval = field(Eval(), "held-out evaluation")
  checkpoint: Checkpoint = field(Checkpoint(), "checkpoints")
  export: Export = field(Export(), "the final export")
  logging: Logging = field(Logging(), "rollout records and experiment trackers")

  def check(self, run, at):
    for fam, opts in self.reward.items():
      if fam in REWARD_FAMILIES:
        allowed = {"weight", *REWARD_FAMILIES[fam].options}
        for k in opts:
          if k not in allowed:
            yield f"reward.{fam}.{k}: unknown option; allowed: {', '.join(sorted(allowed))}"
    if not self.reward and self.rl.steps != 0:
      yield "reward: configure at least one reward family for RL"
    judged = [f for f in self.reward if f in REWARD_FAMILIES and REWARD_FAMILIES[f].needs_judge]
    if self.judge.kind == "none" and judged:
      yield (
        f"judge.kind='none' but reward.{judged[0]} needs a judge: set judge.kind='http' (with judge.endpoints), or "
        "use rewards that need none (timestamp_format, caption_length, fn)"
      )
