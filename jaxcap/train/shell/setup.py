"""What a run is made of, built once from its config: the student and its processor on the mesh, the train and
held-out records, the judge, and the SFT target source."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax

from jaxcap.config.cli import ConfigError
from jaxcap.config.run import Run
from flax import nnx

from jaxcap.checkpoint import load_hf_checkpoint, read_config
from jaxcap.data.manifest import read_manifest
from jaxcap.data.media_check import check_record_media
from jaxcap.processing.media import decode_problem
from jaxcap.data.records import ImageRecord
from jaxcap.judges.factory import build_judge
from jaxcap.judges.preflight import preflight_judge
from jaxcap.judges.protocol import Judge
from jaxcap.models.qwen25vl import Qwen25VL
from jaxcap.processing import Processor
from jaxcap.processing.video import SAMPLING_SETTINGS
from jaxcap.rewards.families import REWARD_FAMILIES
from jaxcap.sharding import make_mesh, param_shardings, reshard
from jaxcap.train.rollouts.placement import rollout_mesh, split_devices
from jaxcap.train.steps.adapters import lora_rank, with_run_lora
from jaxcap.train.shell.memory_check import check_train_memory
from jaxcap.train.shell.pool_memory import check_pool_memory
from jaxcap.world import student as embedded
from jaxcap.data.sft_targets import SFTTarget, sft_target_fn


@dataclasses.dataclass
class Setup:
  model: Qwen25VL
  processor: Processor
  train_records: list[ImageRecord]
  eval_records: list[ImageRecord]
  judge: Judge
  scenes: dict  # scene id -> synthetic-world Scene, for rows that carry one (empty for other data)
  sft_targets: SFTTarget | None  # None when the run has no SFT phase (sft.steps=0)
  mesh: Any  # the learner's (and, colocated, the rollouts')
  rollout_mesh: Any = None  # rollout.devices > 0: the rollouts' own devices (jaxcap.train.rollouts.placement)


def build(config: Run, workdir: Path) -> Setup:
  train_devices, rollout_devices = split_devices(config.rollout.devices)
  if rollout_devices and jax.process_count() > 1 and jax.default_backend() == "cpu":
    # gloo runs the collectives of every device set over one connection per pair of processes: the learner's and
    # a host all-gather in flight at once interleave there ("Received data size doesn't match expected size")
    raise ConfigError(
      f"rollout.devices={config.rollout.devices} with {jax.process_count()} processes on CPU: the CPU collectives "
      "(gloo) cannot keep two device sets' collectives apart; use rollout.devices=0 (colocated) or one process"
    )
  mesh = make_mesh(dict(config.mesh.shape), train_devices)
  rollouts = rollout_mesh(rollout_devices) if rollout_devices else None
  if config.data.train_manifest:
    # kept as strings: Path() folds "hf:///abs/dataset" into "hf:/abs/dataset", a relative name
    train_path, eval_path = config.data.train_manifest, config.data.eval_manifest or ""
    # the user's manifests: media confined to data.media_root (else each manifest's folder) unless allowed
    confine = dict(media_root=config.data.media_root or None, allow_outside_paths=config.data.allow_outside_paths)
  else:
    train_path, eval_path = embedded.build_world_manifests(config, workdir)
    confine = {}  # the synthetic world's: written under the workdir, each inside its own folder
  train = read_manifest(train_path, **confine)
  held_out = (
    read_manifest(eval_path, **confine) if str(eval_path) not in ("", ".") else train._replace(records=[], scenes={})
  )
  train_records, eval_records = train.records, held_out.records
  # every image / frame decoded before any compute: data.bad_media "fail" lists the bad ones, "skip" drops them
  media = {"train": train_records, "held-out": eval_records}
  media = check_record_media(
    media, policy=config.data.bad_media, workdir=workdir, decode=decode_problem if config.data.check_media else None
  )
  train_records, eval_records = media["train"], media["held-out"]
  scenes = {**train.scenes, **held_out.scenes}
  judge = build_judge(config.judge, scenes=scenes, records=train_records + eval_records, seed=int(config.seed))
  # every judge endpoint and role answers one real judgment, before the (minutes-long) checkpoint load
  judge = preflight_judge(judge, config.judge, records=train_records + eval_records)
  model, processor = _student(config, workdir, mesh)
  for name in config.reward:  # e.g. RubiCap drops the manifest's rubrics when RL writes its own
    prepare = REWARD_FAMILIES[name].prepare_records
    if prepare is not None:
      train_records, eval_records = prepare(config, train_records), prepare(config, eval_records)
  # built only for a run with an SFT phase: `:paper` sets sft.steps=0 and keeps the world's default targets
  sft_targets = sft_target_fn(config, scenes) if config.sft.steps else None
  return Setup(model, processor, train_records, eval_records, judge, scenes, sft_targets, mesh, rollouts)


def check_context(config: Run, cfg) -> None:
  """Refuses generation lengths past the model's context before any compute (a paged pool sized for
  sampling.max_new_tokens=100000000 died on its allocation after SFT)."""
  context = int(cfg.text.max_position_embeddings)
  longest = max(int(config.sampling.max_new_tokens), int(config.sft.max_target_tokens) if config.sft.steps else 0)
  if longest >= context:
    key = "sampling.max_new_tokens" if longest == int(config.sampling.max_new_tokens) else "sft.max_target_tokens"
    raise ConfigError(
      f"{key}={longest} does not fit the model's context of {context} positions (max_position_embeddings) beside "
      f"its prompt; set {key} below {context}"
    )


def with_pixel_budget(vision_cfg, data):
  """The processor's image settings with `data.min_pixels` / `data.max_pixels` where set (0 keeps the checkpoint's
  budget, from its preprocessor_config.json)."""
  budget = {k: int(getattr(data, k)) for k in ("min_pixels", "max_pixels") if int(getattr(data, k)) > 0}
  return dataclasses.replace(vision_cfg, **budget) if budget else vision_cfg


# the data block's video fields -> `VideoPreprocessConfig.with_sampling`'s arguments (the annotator's flags too)
VIDEO_SAMPLING = SAMPLING_SETTINGS


def with_video_sampling(video_cfg, data):
  """The processor's video settings with `data.video_*` where set (0 keeps the checkpoint's own, from its
  video_preprocessor_config.json, else the family's defaults): frames per second, the fewest / most frames, each
  frame's pixel floor / ceiling, the clip's pixel budget. Raises ValueError naming the field where the checkpoint's
  video processor cannot take a setting (Qwen3-VL's has no per-frame floor)."""
  given = {arg: getattr(data, key) for key, arg in VIDEO_SAMPLING.items() if getattr(data, key)}
  if not given:
    return video_cfg
  return video_cfg.with_sampling(**given, names={arg: f"data.{key}" for key, arg in VIDEO_SAMPLING.items()})


def with_run_media(processor: Processor, data) -> Processor:
  """`processor` (a checkpoint's or the embedded student's) with the run's media settings where set: the image pixel
  budget (`with_pixel_budget`) and video sampling (`with_video_sampling`). Every processor built from a run config
  (`_student`) goes through here."""
  processor.vision_cfg = with_pixel_budget(processor.vision_cfg, data)
  processor.video_cfg = with_video_sampling(processor.video_cfg, data)
  return processor


def checkpoint_processor(config: Run, cfg) -> Processor:
  """The processor of `model.checkpoint` (its tokenizer, image / video processor configs and prompt) for a model of
  config `cfg`, with the run's media settings (`with_run_media`)."""
  return with_run_media(Processor.from_pretrained(config.model.checkpoint, cfg=cfg), config.data)


def _student(config, workdir: Path, mesh) -> tuple[Qwen25VL, Processor]:
  """A local HF checkpoint (`model.checkpoint`) loaded shard by shard onto the mesh, or the embedded student; the
  processor with the run's media settings (`with_run_media`)."""
  m = config.model
  if m.checkpoint:
    checkpoint_cfg = read_config(m.checkpoint, **m.compute())
    # fail here, with the numbers, rather than be killed by the OOM killer minutes into the load
    check_context(config, checkpoint_cfg)
    check_train_memory(config, checkpoint_cfg, mesh=mesh)
    check_pool_memory(config, checkpoint_cfg)  # the paged engine's pool against one device
    checkpoint_processor(config, checkpoint_cfg)  # and a video setting the checkpoint cannot take, before the load
    model = load_hf_checkpoint(
      m.checkpoint,
      mesh=mesh,
      **m.compute(),
    )
    processor = checkpoint_processor(config, model.cfg)
  else:
    model, processor = embedded.build_student(config, workdir, mesh)
    check_context(config, model.cfg)
    check_pool_memory(config, model.cfg)
    processor = with_run_media(processor, config.data)
  return with_lora(model, config, mesh), processor


def with_lora(model: Qwen25VL, config: Run, mesh) -> Qwen25VL:
  """`model` with the run's LoRA adapters (and QLoRA's quantized base) when `model.lora.rank` > 0, every param
  in its sharding on `mesh` (`jaxcap.sharding.param_shardings`: adapters by their kernel's rules); else `model`."""
  if lora_rank(config) <= 0:
    return model
  graphdef, state = nnx.split(with_run_lora(model, config))
  return nnx.merge(graphdef, reshard(state, param_shardings(state, mesh)))
