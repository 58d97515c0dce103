"""The training phases' blocks: optimiser, the vision warm-up, SFT and RL (with its loss and length mask; how RL
draws its captions: jaxcap.config.sampling), Batch sizes are per process."""

from __future__ import annotations

import dataclasses

from jaxcap.choices import MASTER_UPDATES, SCHEDULES
from jaxcap.fields import ALLOWED, Block, field
from jaxcap.data.sft_targets import SFT_TARGETS
from jaxcap.config.rl_blocks import LengthMask, Loss, Overlong, RolloutCorrection, partial_rollout_problems
from jaxcap.rl import ADVANTAGE_ESTIMATORS


def _trains(block, run) -> bool:
  return block.steps > 0


@dataclasses.dataclass(frozen=True)
class Optim(Block):
  """A phase's AdamW optimiser and learning-rate schedule (`jaxcap.config_files.optim` builds one)."""

  lr: float = field(doc="peak learning rate", gt=0)
  warmup_ratio: float = field(0.0, "linear warm-up over this share of the phase's steps", ge=0, lt=1)
  warmup_steps: int = field(0, "linear warm-up over this many steps (takes precedence over warmup_ratio)", ge=0)
  schedule: str = field("cosine", "the learning rate after the warm-up", choices=SCHEDULES)
  weight_decay: float = field(0.0, "AdamW weight decay (matrices only)", ge=0)
  b1: float = field(0.9, "Adam's first-moment decay rate", ge=0, lt=1)
  b2: float = field(0.999, "Adam's second-moment decay rate", ge=0, lt=1)
  eps: float = field(1e-8, "Adam's epsilon", gt=0)
  grad_clip: float = field(1.0, "global gradient-norm clip", ge=0, hint="0 = no clipping")
  # how updates land on bfloat16 master weights (jaxcap.train.steps.precision): "exact" rounds to nearest (needs
  # model.param_dtype float32 at fine-tuning learning rates), "stochastic_rounding" is unbiased (bfloat16 masters)
  master_update: str = field(
    "exact",
    "how updates land on the master weights",
    choices=MASTER_UPDATES,
    rule="choose one of exact, stochastic_rounding",
  )


class Phase(Block):
  """What SFT and RL share: accumulation that divides the batch, and master weights that can take the updates."""

  def check(self, run, at):
    if self.batch_size >= 1 and self.micro_batches >= 1 and self.batch_size % self.micro_batches:
      yield f"{at}batch_size={self.batch_size} is not divisible by {at}micro_batches={self.micro_batches}"
    # with LoRA the trained params are the float32 adapters; a bfloat16 base is frozen, never updated
    bf16_masters = run.model.param_dtype == "bfloat16" and run.model.lora.rank == 0
    if self.steps != 0 and bf16_masters and self.optim.master_update == "exact":
      yield (
        f"model.param_dtype='bfloat16' with {at}optim.master_update='exact': most AdamW updates at fine-tuning "
        f"learning rates (lr={self.optim.lr}) round away in bfloat16 master weights. Set --config.model.param_dtype="
        f"float32 (float32 masters, keep model.dtype=bfloat16 for compute) or --config.{at}optim.master_update="
        "stochastic_rounding"
      )
    yield from self._check_packing(run, at)

  def longest_completion(self, run) -> tuple[str, int]:
    """(the key, its value) bounding a completion's tokens in this phase's rows."""
    raise NotImplementedError

  def _check_packing(self, run, at):
    if self.micro_batch_tokens <= 0 or self.steps == 0:
      return
    key, longest = self.longest_completion(run)
    if self.micro_batch_tokens <= longest:
      yield (
        f"{at}micro_batch_tokens={self.micro_batch_tokens}: must exceed {key}={longest} (a row holds a prompt and "
        "its longest completion)"
      )
    if run.distributed.coordinator_address or run.distributed.num_processes > 1:
      yield f"{at}micro_batch_tokens > 0 runs on one process for now; set {at}micro_batch_tokens=0 for multi-host runs"


def _packing_min_saving(phase: str):
  """`<phase>.packing_min_saving` (jaxcap.train.packing.rows.packing_pays): a packed slot costs more than its FLOPs
  (gathers, the attention window's scatter), so a step whose packing saves a few percent (uniform lengths) runs
  padded."""
  return field(
    0.1,
    "a step runs packed only when packing saves at least this share of its padded pass's decoder FLOPs",
    lt=1,
    resume=ALLOWED,
    hint=f"else that step runs the padded programs, if a padded {phase}.micro_batches slice also fits "
    f"{phase}.micro_batch_tokens; < 0 = every step packed",
  )


@dataclasses.dataclass(frozen=True)
class Sft(Phase):
  """Supervised fine-tuning on target captions (the warm start for RL)."""

  # more steps may come on resume; a phase cut below its checkpoint, or SFT changed after it ended, is refused by
  # jaxcap.train.shell.resume
  steps: int = field(1600, "SFT steps (0 = no SFT)", ge=0, resume=ALLOWED)
  batch_size: int = field(16, "records per process per SFT step", ge=1, hint="records per process per step")
  micro_batches: int = field(1, "gradient-accumulation slices of a batch", ge=1, hint="1 = no accumulation")
  max_target_tokens: int = field(48, "target tokens kept per example", ge=1, when=_trains)
  targets: str = field(
    "incomplete", "'incomplete' / 'complete' world captions, or the manifest's 'reference'", choices=SFT_TARGETS
  )
  # 'incomplete' names the first k of n objects, k uniform in 1..max_fraction * n: the SFT student names the
  # second object of a two-object scene only sometimes (greedy captions mostly stop after one), which RL
  # can reinforce; with max_fraction 0.5 it never does, and RL had nothing to find.
  max_fraction: float = field(
    1.0, "incomplete targets name at most this share of the objects", gt=0, le=1, when=_trains
  )
  optim: Optim = field(Optim(2e-3, warmup_steps=20), "the SFT optimiser")
  # Packed rows (jaxcap.train.packing.rows), as rl.micro_batch_tokens: each (prompt, target) at its own length, several per
  # row; the loss and gradients equal the padded step's to float rounding, so a resume may change it.
  micro_batch_tokens: int = field(
    0,
    "packed micro-batches of at most this many tokens for the SFT step",
    ge=0,
    resume=ALLOWED,
    hint="0 = off: padded rows in sft.micro_batches slices, which only lay out the batch when on; it must hold the "
    "longest prompt plus sft.max_target_tokens",
  )
  packing_min_saving: float = _packing_min_saving("sft")
  # Training the tower along with the decoder from the warm-up lost much of what the warm-up taught (held-out QA
  # after SFT 41% instead of 53%, 64 images).
  freeze_vision: bool = field(True, "no updates to the vision tower in this phase")
  # multiple-choice VQA with the image (one of the record's questions, lettered; target "B. red",
  # jaxcap.processing.vqa) instead of captions: a second skill whose retention the VQA probe (jaxcap.eval.vqa)
  # measures. Drawn per (seed, step, record); records without questions get captions.
  vqa_fraction: float = field(
    0.0,
    "the share of SFT examples that are VQA instead of captions",
    ge=0,
    lt=1,
    hint="the share of SFT examples that are multiple-choice VQA instead of captions; 0 = captions only, and some "
    "captions must remain",
  )

  def longest_completion(self, run):
    return "sft.max_target_tokens", self.max_target_tokens


@dataclasses.dataclass(frozen=True)
class Rl(Phase):
  """Group-relative policy optimisation against the reward."""

  # old name -> new name (and, keyed '?old', how to carry the old value over), named by the parser's error
  RENAMED = {
    "off_policy_steps": "max_staleness",
    "?off_policy_steps": "the same value means the same schedule (1: each round rolled out one update ahead)",
  }

  steps: int = field(100, "RL steps (0 = no RL)", ge=0, resume=ALLOWED)
  batch_size: int = field(8, "images per process per RL step", ge=1, hint="records per process per step")
  num_samples: int = field(
    8, "captions sampled per image (the group)", ge=2, rule="group advantages need >= 2", when=_trains
  )
  micro_batches: int = field(1, "gradient-accumulation slices of a batch", ge=1, hint="1 = no accumulation")
  # Packed rows (jaxcap.train.packing.rows): the log-prob passes and the update see each (prompt, completion) at its own
  # length, several per row, instead of every row padded to the longest prompt plus the longest caption. The values
  # equal the padded path's to float rounding (tests/train/test_packed_update.py), so a resume may change it.
  micro_batch_tokens: int = field(
    0,
    "packed micro-batches of at most this many tokens for the log-prob passes and the update",
    ge=0,
    resume=ALLOWED,
    hint="0 = off: padded rows in rl.micro_batches slices, which only lay out the batch when on; it must hold the "
    "longest prompt plus sampling.max_new_tokens",
  )
  packing_min_saving: float = _packing_min_saving("rl")
  estimator: str = field("grpo", "the group advantage estimator", choices=ADVANTAGE_ESTIMATORS)
  recompute_old_logprobs: bool = field(True, "recompute the sampling policy's log-probs with the training program")
  loss: Loss = field(Loss(), "the policy-gradient loss")
  length_mask: LengthMask = field(LengthMask(), "BalCapRL's length mask")
  rollout_correction: RolloutCorrection = field(RolloutCorrection(), "the behaviour / trainer mismatch correction")
  overlong: Overlong = field(Overlong(), "DAPO's soft overlong penalty")
  mask_truncated: bool = field(False, "captions that hit sampling.max_new_tokens without a stop token get no gradient")
  # lr 3e-4 drifted (KL 0.4) and lost held-out QA (53% -> 51% on 64 images); 1e-4 gained (53% -> 64%)
  optim: Optim = field(Optim(1e-4, warmup_steps=5, schedule="constant"), "the RL optimiser")
  freeze_vision: bool = field(False, "no updates to the vision tower in this phase")
  # dynamic sampling (verl's filter_groups, EasyR1's online_filtering; jaxcap.rl.group_filter): a group whose G
  # valid rewards are all equal has zero advantages, a full rollout and update for no gradient
  filter_groups: str = field(
    "off",
    "drop groups whose valid rewards have zero spread and refill the batch from the loader",
    hint="off, spread (any weighted reward dimension) or a reward dimension's name",
  )
  filter_groups_max_extra: int = field(
    0,
    "most extra prompts per process drawn per step to refill dropped groups, in whole batches",
    ge=0,
    hint="a multiple of rl.batch_size; 0 = drop without refilling",
  )
  # asynchronous RL (jaxcap.train.rollouts.fully_async): a rollout thread generates and judges the rounds of the next k
  # steps while the learner updates; round r is rolled out by the weights of update max(window start, r - k), a rule
  # that reads only the config, so a run (and its resume) is the same whatever the timing; the sampler's log-probs
  # are the behaviour policy's
  max_staleness: int = field(
    0,
    "updates between the weights that generate a step's rollouts and the weights it updates",
    ge=0,
    hint="0 = on-policy; k > 0 rolls out and judges the next k steps' rounds while this step updates",
  )
  partial_rollouts: bool = field(
    False,
    "a window's rounds through one paged engine: samples still decoding when a round finishes continue under the "
    "next weights (each token's version recorded) instead of the slots idling",
    hint="needs rl.max_staleness >= 2 and rollout.engine=paged; one engine per process (rollout.devices=1)",
  )
  # streaming judging (jaxcap.rewards.streaming): the paged engine hands each prompt's G captions to the judge as
  # soon as they are decoded; the rewards are those of judging the batch after the rollout, so a resume may change
  # it. The static engine finishes every group at once: there the batch is judged after the rollout either way.
  stream_judging: bool = field(
    False, "judge each group as soon as its G samples are decoded (rollout.engine=paged)", resume=ALLOWED
  )

  def check(self, run, at):
    yield from super().check(run, at)
    if self.max_staleness and self.filter_groups != "off":
      yield (
        f"{at}max_staleness={self.max_staleness} does not combine with {at}filter_groups={self.filter_groups!r} "
        f"yet (refills would draw from the loader ahead of the queued batches); set one of them off"
      )
    yield from partial_rollout_problems(self, run, at)
    if not isinstance(self.filter_groups, str) or not self.filter_groups.strip():
      yield f"{at}filter_groups={self.filter_groups!r}: use off, spread or a reward dimension's name"
    if self.batch_size >= 1 and self.filter_groups_max_extra > 0 and self.filter_groups_max_extra % self.batch_size:
      yield (
        f"{at}filter_groups_max_extra={self.filter_groups_max_extra}: refills draw whole batches; use a multiple of "
        f"{at}batch_size={self.batch_size} (e.g. {self.batch_size * max(1, self.filter_groups_max_extra // self.batch_size)})"
      )
    if self.filter_groups == "off" and self.filter_groups_max_extra > 0:
      yield f"{at}filter_groups_max_extra={self.filter_groups_max_extra} does nothing with {at}filter_groups=off"

  def longest_completion(self, run):
    return "sampling.max_new_tokens", run.sampling.max_new_tokens


@dataclasses.dataclass(frozen=True)
class VisionWarmup(Block):
  """Embedded student only (skipped with model.checkpoint): its random ViT first learns, per merged visual token,
  the colour / shape / size of the object centred in that cell, on freshly drawn scenes (world/vision_warmup.py),
  standing in for a real VLM's pretrained ViT; SFT then trains the decoder on top of it (sft.freeze_vision).
  Without it, SFT captions named one stock object in almost every image (colour right in 6 of 64 held-out
  images); with it, 232 of 256, and held-out QA accuracy after SFT is 52.0% (it was 9.1%)."""

  steps: int = field(800, "warm-up steps (0 = none)", ge=0)
  batch_size: int = field(64, "scenes per warm-up step", ge=1, when=_trains)
  lr: float = field(2e-3, "the warm-up's learning rate", gt=0, when=_trains)
