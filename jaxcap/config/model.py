"""The policy and its inputs: the model (and the embedded student), the synthetic world, the data."""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from jaxcap.choices import DTYPES, PARAM_DTYPES, REMAT_POLICIES
from jaxcap.fields import ALLOWED, ALTERS, SHAPE, Block, field
from jaxcap.data.media_check import BAD_MEDIA_POLICIES
from jaxcap.choices import LINEAR_ATTENTION_TARGETS, LORA_TARGETS, VISION_TARGETS, WEIGHT_QTYPES
from jaxcap.models.config import dtype_from_name
from jaxcap.checkpoint.precision import checkpoint_dtype
from jaxcap.models.families import FAMILIES, preset_names
from jaxcap.processing.rules import PROCESSOR_RULES


@dataclasses.dataclass(frozen=True)
class Student(Block):
  """The tiny embedded student (jaxcap.world.student.student_config), built when model.checkpoint is empty."""

  RESUME = SHAPE

  vision_width: int = field(128, "ViT width (heads of 32)", ge=1)
  vision_depth: int = field(2, "ViT blocks", ge=1)
  text_width: int = field(128, "decoder width", ge=1)
  text_layers: int = field(3, "decoder layers", ge=1)
  text_heads: int = field(4, "decoder query heads (keys shared over text_heads // 2 groups)", ge=1)
  rope_theta: float = field(10000.0, "RoPE base", gt=0)

  def active(self, run) -> bool:
    return not run.model.checkpoint

  def check(self, run, at):
    w, h = self.text_width, self.text_heads
    if h >= 1 and (w % h or (w // h) % 2):
      yield f"{at}text_width={w} must split into text_heads={h} heads of an even size"
    if h >= 1 and h % max(1, h // 2):
      yield (
        f"{at}text_heads={h}: the student shares keys over text_heads // 2 groups, which must divide text_heads "
        "(use 1, 3 or an even number)"
      )
    if run.model.family == "qwen3_5" and self.text_layers < 2:
      yield (
        f"{at}text_layers={self.text_layers}: a Qwen3.5 student interleaves linear-attention and full-attention "
        "layers, so it needs at least 2; set it to 2 or more"
      )
    heads = max(1, self.vision_width // 32)
    if self.vision_width >= 1 and self.vision_width % heads:
      yield (
        f"{at}vision_width={self.vision_width} does not split into its {heads} heads (vision_width // 32); use a "
        "multiple of 32"
      )


@dataclasses.dataclass(frozen=True)
class Lora(Block):
  """Low-rank adapters on the frozen base (qwix, `jaxcap.models.lora`): only the adapters train and hold optimizer
  state; with `weight_qtype` the frozen base is quantized (QLoRA). rank 0 = full fine-tuning. The embedded student
  (no model.checkpoint) has no pretrained base: its SFT trains the base with the adapters held, its RL the adapters
  (`jaxcap.train.steps.adapters.trains_base`)."""

  RESUME = SHAPE

  rank: int = field(0, "adapter rank r (0 = off: full fine-tuning)", ge=0)
  alpha: float = field(32.0, "scale numerator: the adapter adds (alpha / rank) x A B", gt=0, resume=ALTERS)
  dropout: float = field(0.0, "dropout on the adapters' input (only 0 is supported)", ge=0, lt=1)
  targets: list[str] = field(tuple(LORA_TARGETS), "module names that get adapters (the sharding rules' names)")
  vision: bool = field(False, "adapters on the vision tower's / merger's matching modules too")
  weight_qtype: str = field("", "QLoRA: the frozen base's weights quantized ('' = not)", choices=WEIGHT_QTYPES)

  def check(self, run, at):
    if self.dropout:
      yield f"{at}dropout={self.dropout}: adapter dropout is not supported yet; set {at}dropout=0"
    unknown = sorted(set(self.targets) - set(LORA_TARGETS) - set(LINEAR_ATTENTION_TARGETS) - set(VISION_TARGETS))
    if unknown:
      known = ", ".join(LORA_TARGETS + LINEAR_ATTENTION_TARGETS + VISION_TARGETS)
      yield f"{at}targets={list(self.targets)}: unknown module name(s) {', '.join(unknown)}; choose among {known}"
    if not self.targets:
      yield f"{at}targets=[]: name at least one module (default: {', '.join(LORA_TARGETS)})"
    if self.weight_qtype and self.rank and not run.model.checkpoint and run.sft.steps:
      # the embedded student has no pretrained base: its SFT trains the base, which QLoRA stores as integers
      yield (
        f"{at}weight_qtype={self.weight_qtype!r}: the embedded student (no model.checkpoint) trains its base in SFT "
        f"(sft.steps={run.sft.steps}), and a quantized base cannot train; set model.checkpoint to a pretrained base, "
        f"sft.steps=0, or {at}weight_qtype=''"
      )


@dataclasses.dataclass(frozen=True)
class Model(Block):
  """The policy: a local Qwen2.5-VL checkpoint or the embedded student, and how it computes."""

  checkpoint: str = field("", "local HF Qwen2.5-VL / Qwen3-VL directory; empty = the tiny embedded student")
  family: str = field(
    "qwen2_5_vl",
    "the embedded student's family (a checkpoint's config.json names its own)",
    choices=tuple(FAMILIES),
    resume=SHAPE,
  )
  dtype: str = field("float32", "compute dtype", choices=DTYPES)
  # "auto" (`param_dtype_name`): a LoRA run's frozen checkpoint base in the checkpoint's stored dtype (bfloat16 for
  # the released Qwen checkpoints: half the bytes of float32, and the frozen base takes no update), else float32
  # (full fine-tuning's master weights, the embedded student's base, which its SFT trains)
  param_dtype: str = field(
    "auto",
    "master-weight dtype ('auto': float32, or a LoRA run's frozen checkpoint base in the checkpoint's own dtype)",
    choices=PARAM_DTYPES,
  )
  # remat and logprob_chunk are memory / speed knobs with the same math
  remat: str = field(
    "none", "activation checkpointing of each block (same math)", choices=REMAT_POLICIES, resume=ALLOWED
  )
  logprob_chunk: int = field(
    256,
    "LM-head positions per chunk in log-prob passes (lower = less memory, see jaxcap.plan)",
    ge=1,
    rule="must be a positive token count",
    resume=ALLOWED,
  )
  # the same stacked parameters, scanned or unrolled; the tiny embedded student trains ~13% faster on CPU unrolled,
  # so the default unrolls and real checkpoints (real_model_run) scan
  scan_layers: bool = field(False, "layer stacks under lax.scan: compile time flat in depth", resume=ALLOWED)
  share_prompt: bool = field(
    True,
    "log-prob passes and updates run each prompt through the decoder once for its G completions (same math)",
    resume=ALLOWED,
    hint="False repeats the prompt per completion (N x (P + C) decoder positions instead of B x P + N x C)",
  )
  student: Student = field(Student(), "the embedded student's shape")
  lora: Lora = field(Lora(), "low-rank adapters (LoRA / QLoRA) instead of full fine-tuning")

  def param_dtype_name(self, source: str | None = None) -> str:
    """The dtype the params are held in: `param_dtype` when set, else ("auto") the stored dtype of the frozen base
    of a LoRA run on a checkpoint (`source`, default `checkpoint`: a directory's config.json, float16 or unstated
    held in float32; a released model's preset: bfloat16), else float32."""
    return held_param_dtype(self.param_dtype, self.lora.rank, self.checkpoint if source is None else source)

  def compute(self, source: str | None = None) -> dict:
    """How the model computes, as `Qwen25VLConfig` fields: what every builder of the policy (the embedded student,
    a checkpoint's load, `jaxcap.plan`: `source`, its checkpoint directory or preset) applies to the family's
    config."""
    return dict(
      dtype=dtype_from_name(self.dtype),
      param_dtype=dtype_from_name(self.param_dtype_name(source)),
      remat=self.remat,
      logprob_chunk=self.logprob_chunk,
      scan_layers=self.scan_layers,
      share_prompt=self.share_prompt,
    )


@dataclasses.dataclass(frozen=True)
class World(Block):
  """The embedded synthetic world, used when data.train_manifest is empty. 1-2 objects per scene: two-object
  scenes leave the SFT caption one object short for RL to add; with 1-3 objects the student perceived less (held-out
  QA after SFT 33% instead of 41% on 64 images, tower trained)."""

  train_scenes: int = field(1024, "scenes in the training split", ge=0)
  eval_scenes: int = field(256, "scenes in the held-out split", ge=0)
  image_size: int = field(84, "rendered square side, pixels", ge=64, le=1024, rule="use 64..1024 pixels")
  min_objects: int = field(1, "fewest objects per scene (1 <= min_objects <= max_objects <= 6)")
  max_objects: int = field(2, "most objects per scene (at most 6)")
  clip_fraction: float = field(0.0, "share of objects cut by the image border", ge=0, le=1)
  vocab_size: int = field(512, "the world tokenizer's vocabulary (the embedded student's embedding rows)", resume=SHAPE)
  curate_questions: bool = field(True, "CapRL's QA curation on the train split (held-out is always curated)")

  def active(self, run) -> bool:
    return not run.data.train_manifest

  def check(self, run, at):
    if not 1 <= self.min_objects <= self.max_objects <= 6:
      yield (
        f"{at}min_objects={self.min_objects}, max_objects={self.max_objects}: need 1 <= min_objects <= max_objects <= 6"
      )
    for phase in ("sft", "rl"):
      p = getattr(run, phase)
      if p.steps != 0 and self.train_scenes < p.batch_size:
        yield (
          f"{at}train_scenes={self.train_scenes} cannot fill one {phase} batch of {phase}.batch_size={p.batch_size}; "
          f"raise {at}train_scenes or lower the batch size"
        )


@dataclasses.dataclass(frozen=True)
class Data(Block):
  """Manifests and how images become model inputs."""

  train_manifest: str = field("", "JSONL/Parquet training manifest; empty = the synthetic world")
  eval_manifest: str = field("", "held-out JSONL/Parquet manifest; empty = the synthetic world")
  # a manifest row's media outside its data root (`../../etc/passwd`, an absolute path elsewhere) is refused
  # (jaxcap/data/media_root.py); relative paths still resolve against the manifest's folder
  media_root: str = field(
    "", "the folder every manifest media path must lie in (empty = each manifest's own folder)", resume=ALLOWED
  )
  allow_outside_paths: bool = field(
    False, "read manifest media paths outside the data root (e.g. released rows' absolute paths)", resume=ALLOWED
  )
  prompt: str = field("Describe this image in detail.", "the user turn before the image")
  image_size: int = field(84, "every image resized to this square side, pixels", ge=0, hint="0 = native size")
  min_pixels: int = field(0, "the native-size pixel budget's floor (0 = the checkpoint's preprocessor_config)", ge=0)
  max_pixels: int = field(0, "the native-size pixel budget's ceiling (0 = the checkpoint's preprocessor_config)", ge=0)
  # how video files are sampled and sized (the processor's video config: jaxcap/processing/video.py, qwen3_video.py);
  # 0 = the checkpoint's own (video_preprocessor_config.json, else the family's defaults: 2 fps, 4..768 frames)
  video_fps: float = field(0.0, "frames sampled per second of a video file (0 = the checkpoint's)", ge=0)
  video_min_frames: int = field(0, "fewest frames sampled from a video (0 = the checkpoint's)", ge=0)
  video_max_frames: int = field(
    0, "most frames sampled from a video (0 = the checkpoint's)", ge=0, hint="0, or at least 2 (the temporal patch)"
  )
  video_min_pixels: int = field(
    0, "each video frame's pixel floor (0 = the checkpoint's; Qwen3-VL has none: its floor bounds the clip)", ge=0
  )
  video_max_pixels: int = field(0, "each video frame's pixel ceiling (0 = the checkpoint's)", ge=0)
  video_total_pixels: int = field(
    0, "a clip's pixel budget, shared over its frames (0 = the checkpoint's; Qwen3-VL: its clip max_pixels)", ge=0
  )
  pad_to_multiple: int = field(16, "sequence lengths padded to a multiple of this", ge=1)
  # more steps pad less and compile more programs (benchmarks/mixed_sizes.py); padding is masked: the same math
  bucket_steps: int = field(
    2, "padded sizes per octave of prompt / vision-pack length (jaxcap.buckets)", ge=1, resume=ALLOWED
  )
  group_by_size: int = field(
    0, "> 1: windows of this many batches sorted by image size (jaxcap.train.rollouts.size_groups); 0 = shuffled", ge=0
  )
  check_media: bool = field(
    True, "decode every image / frame before training (False: only check they exist)", resume=ALLOWED
  )
  # 'fail': one error listing every record that does not decode; 'skip': train on the rest, the bad ones listed in
  # workdir/media_errors.jsonl (jaxcap/data/media_check.py)
  bad_media: str = field("fail", "what undecodable media do", choices=BAD_MEDIA_POLICIES)

  def check(self, run, at):
    if self.max_pixels and self.min_pixels > self.max_pixels:
      yield (
        f"{at}min_pixels={self.min_pixels}, max_pixels={self.max_pixels}: need 0 <= min_pixels <= max_pixels "
        "(0 = the checkpoint's own)"
      )
    for low, high in (("video_min_frames", "video_max_frames"), ("video_min_pixels", "video_max_pixels")):
      lo, hi = getattr(self, low), getattr(self, high)
      if lo and hi and lo > hi:
        yield f"{at}{low}={lo}, {high}={hi}: need {low} <= {high} (0 = the checkpoint's own)"
    if self.video_max_frames == 1:
      yield (
        f"{at}video_max_frames=1: a clip needs at least 2 frames (the temporal patch; a single frame is an image); "
        f"set {at}video_max_frames >= 2, or 0 for the checkpoint's own"
      )
    if self.video_min_pixels and not run.model.checkpoint and not _has_frame_floor(run.model.family):
      yield (
        f"{at}video_min_pixels={self.video_min_pixels}: the {run.model.family} student's video processor has no "
        f"per-frame pixel floor (its floor bounds the whole clip); set {at}video_min_pixels=0"
      )
    if self.train_manifest and not self.eval_manifest and run.eval.num_images:
      yield f"{at}eval_manifest: set a held-out manifest, or --config.eval.num_images=0 to skip evaluation"


SYNTHETIC_PRESETS = ("tiny", "mid")  # the presets of no released checkpoint (every family has both)


def held_param_dtype(param_dtype: str, lora_rank: int, source: str) -> str:
  """`Model.param_dtype_name`'s rule: `param_dtype` unless 'auto'; then the frozen base's stored dtype for a LoRA
  run (rank > 0) on `source` (a checkpoint directory or a preset), else float32."""
  if param_dtype != "auto":
    return param_dtype
  return base_dtype_name(source) if int(lora_rank) > 0 and source else "float32"


def base_dtype_name(source: str) -> str:
  """The dtype a frozen base from `source` is held in: a checkpoint directory's stored dtype (float16 or unstated:
  float32, which keeps it exactly), a released model's preset bfloat16 (its checkpoints' dtype), the synthetic
  presets (tiny, mid) float32."""
  if os.path.isdir(source):
    return np.dtype(checkpoint_dtype(source)).name
  return "bfloat16" if source in preset_names() and source not in SYNTHETIC_PRESETS else "float32"


def _has_frame_floor(family: str) -> bool:
  """Whether the video processor of the embedded student's family bounds each frame from below (Qwen3-VL's floor
  bounds the whole clip); an unknown family (its own error) passes."""
  return family not in FAMILIES or PROCESSOR_RULES[FAMILIES[family].processor].video_config.per_frame_floor
