"""Training for the experiments suite: the shared start (vision warm-up + SFT, trained once and cached by its config)
and each arm's run from it, cached by its resolved config, so a rerun trains only what changed.

Layout under the suite workdir: cache/start-<kind>-<hash>/ (a training workdir: world, captions, export),
cache/arms/<hash>/ (an arm's workdir; its Orbax checkpoints are deleted once it finished, the captions, metrics
and summary stay), cache/compile/ (the persistent XLA cache every run shares).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import time
from pathlib import Path

import ml_collections

from jaxcap.experiments.spec import merge, method_config

START_KINDS = ("caption", "caption_vqa")
VQA_FRACTION = 0.3  # share of the caption_vqa start's SFT examples that are (image, question) -> answer


@dataclasses.dataclass(frozen=True)
class Settings:
  """Suite-wide settings: RL steps per arm, seeds, and the smoke mode's tiny world and step counts."""

  workdir: Path
  rl_steps: int = 100
  seeds: tuple[int, ...] = (0, 1)
  smoke: bool = False
  eval_images: int = 256


def config_hash(config: ml_collections.ConfigDict, ignore=("workdir", "compile_cache", "logging")) -> str:
  d = {k: v for k, v in config.to_dict().items() if k not in ignore}
  return hashlib.sha1(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _smoke(c: ml_collections.ConfigDict) -> None:
  """A start of few steps on a tiny world: checks the machinery, not the methods."""
  c.world.update(dict(train_scenes=64, eval_scenes=32))
  c.model.student.update(dict(text_layers=1, vision_depth=1))  # the arms train from its export: the same student
  c.vision_warmup.update(dict(steps=10, batch_size=8))
  c.sft.update(dict(steps=10, batch_size=8))
  c.eval.num_images = 32


def start_config(kind: str, s: Settings) -> ml_collections.ConfigDict:
  """The start every arm of `kind` trains from: the CapRL main job's warm-up and SFT (configs/caprl.py), no RL;
  'caption_vqa' also teaches answering the world's questions with the image (sft.vqa_fraction)."""
  if kind not in START_KINDS:
    raise ValueError(f"start {kind!r}: use one of {START_KINDS}")
  c = method_config("caprl")
  with c.unlocked():
    c.rl.steps = 0
    c.eval.num_images = s.eval_images
    c.checkpoint.every = 0
    if kind == "caption_vqa":
      c.sft.vqa_fraction = VQA_FRACTION
    if s.smoke:
      _smoke(c)
    c.name = f"start_{kind}"
    c.workdir = str(s.workdir / "cache" / f"start-{kind}-{config_hash(c)}")
    c.compile_cache = str(s.workdir / "cache" / "compile")
  return c


@dataclasses.dataclass(frozen=True)
class Start:
  """A trained start: its workdir, exported policy, world manifests and held-out captions."""

  workdir: Path
  wall_s: float  # what training it took (saved by every later reuse)
  reused: bool

  @property
  def export(self) -> Path:
    return self.workdir / "export"

  @property
  def heldout_manifest(self) -> Path:
    return self.workdir / "world" / "heldout" / "manifest.jsonl"

  def train_manifest(self, curated: bool = True) -> Path:
    return self.workdir / "world" / ("train" if curated else "train_uncurated") / "manifest.jsonl"

  @property
  def captions(self) -> Path:
    return self.workdir / "captions" / "sft_end.jsonl"


def _train(config: ml_collections.ConfigDict) -> float:
  """Runs one config to its end in this process; returns the wall time in seconds."""
  import os

  import jax

  from jaxcap.config_files import validate
  from jaxcap.train.shell.trainer import Trainer

  if "JAX_COMPILATION_CACHE_DIR" not in os.environ and config.compile_cache:  # as the launcher does
    jax.config.update("jax_compilation_cache_dir", config.compile_cache)
  t0 = time.perf_counter()
  Trainer(validate(config)).run()  # parsed once, here at the boundary, as the launcher does
  return time.perf_counter() - t0


def ensure_start(kind: str, s: Settings, log=print) -> Start:
  """The cached start of `kind`, trained first if its config changed or it never finished; also writes the
  uncurated train world beside the curated one (for arms with curated=False)."""
  c = start_config(kind, s)
  wd = Path(c.workdir)
  done = wd / "start.json"
  if done.exists():
    info = json.loads(done.read_text())
    log(f"start {kind}: reused {wd} (saves {info['wall_s']:.0f} s of training)")
    return Start(wd, float(info["wall_s"]), True)
  log(f"start {kind}: training (vision warm-up {c.vision_warmup.steps}, SFT {c.sft.steps} steps) in {wd}")
  wall = _train(c)
  from jaxcap.world.student import build_world, world_config

  w = c.world
  build_world(
    wd,
    world=world_config(w),
    train_scenes=w.train_scenes,
    eval_scenes=w.eval_scenes,
    seed=int(c.seed),
    curate_train=False,
  )
  shutil.rmtree(wd / "checkpoints", ignore_errors=True)  # the export is what arms start from
  done.write_text(json.dumps({"wall_s": wall, "config": json.loads(c.to_json())}, indent=1))
  return Start(wd, wall, False)


def arm_config(arm: dict, start: Start, seed: int, s: Settings, *, export: bool) -> ml_collections.ConfigDict:
  """The arm's run config: `configs/<method>.py`, the suite's RL steps, the arm's overrides, then the start
  (its exported policy, its world) and the seed. An 'sft' arm continues SFT on the start's caption targets for as
  many sequences as the RL arm updates (rl.steps x rl.batch_size x rl.num_samples)."""
  c = method_config(arm["method"])
  with c.unlocked():
    c.rl.steps = s.rl_steps if not s.smoke else 2
    merge(c, arm["overrides"])
    if s.smoke:  # RL batches of 4 prompts x 4 samples: the machinery, not the methods
      c.rl.update(dict(batch_size=4, num_samples=4))
    c.seed = int(seed)
    c.model.checkpoint = str(start.export)
    c.vision_warmup.steps = 0
    c.data.train_manifest = str(start.train_manifest(arm["curated"]))
    c.data.eval_manifest = str(start.heldout_manifest)
    # measured once, on the start itself: every arm's RL-start eval would repeat it
    c.eval.update(dict(every=0, num_images=s.eval_images if not s.smoke else 32, at_rl_start=False))
    c.checkpoint.every = 0
    c.export.hf = bool(export)
    if arm["phase"] == "sft":
      c.sft.steps = -(-c.rl.steps * c.rl.batch_size * c.rl.num_samples // c.sft.batch_size)
      c.rl.steps = 0
    else:
      c.sft.steps = 0
    c.name = f"arm_{arm['method']}"
    c.workdir = str(s.workdir / "cache" / "arms" / config_hash(c))
    c.compile_cache = str(s.workdir / "cache" / "compile")
  return c


@dataclasses.dataclass(frozen=True)
class ArmRun:
  """One finished (arm, seed): its workdir, held-out captions at the end, and what training took."""

  workdir: Path
  phase: str
  wall_s: float
  reused: bool

  @property
  def captions(self) -> Path:
    return self.workdir / "captions" / f"{self.phase}_end.jsonl"

  @property
  def export(self) -> Path:
    return self.workdir / "export"


def ensure_arm(arm: dict, start: Start, seed: int, s: Settings, *, export: bool, log=print) -> ArmRun:
  c = arm_config(arm, start, seed, s, export=export)
  wd = Path(c.workdir)
  done = wd / "arm.json"
  if done.exists():
    return ArmRun(wd, arm["phase"], float(json.loads(done.read_text())["wall_s"]), True)
  if wd.exists():  # an interrupted run: start it over (its checkpoints may be from an older tree)
    shutil.rmtree(wd)
  wall = _train(c)
  shutil.rmtree(wd / "checkpoints", ignore_errors=True)
  done.write_text(json.dumps({"wall_s": wall, "config": json.loads(c.to_json())}, indent=1))
  return ArmRun(wd, arm["phase"], wall, False)
