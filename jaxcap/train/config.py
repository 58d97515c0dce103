"""The run config: one ml-collections tree shared by every method's config file, and its validation.

Defaults describe the embedded default (synthetic world, tiny student, rule-based judge) that finishes on a
laptop CPU; each config file's `paper` variant sets the published hyper-parameters for a real Qwen2.5-VL.
"""

from __future__ import annotations

import functools

import ml_collections

from jaxcap.judges.factory import JUDGE_KINDS, judge_config
from jaxcap.registry import Registry
from jaxcap.rewards.families import REWARD_FAMILIES
from jaxcap.rl import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, LOSS_AGGREGATIONS
from jaxcap.world import student as embedded  # noqa: F401  (registers the synthetic world's SFT target sources)
from jaxcap.train.precision import MASTER_UPDATES
from jaxcap.data.sft_targets import SFT_TARGETS

# Every name a config chooses from, by the field that chooses it (validate() and the launcher's --help read these).
REGISTRIES: dict[str, Registry] = {
  "rl.estimator": ADVANTAGE_ESTIMATORS,
  "rl.loss.aggregation": LOSS_AGGREGATIONS,
  "rl.loss.kl_estimator": KL_ESTIMATORS,
  "reward": REWARD_FAMILIES,
  "judge.kind": JUDGE_KINDS,
  "sft.targets": SFT_TARGETS,
}


def optim(
  lr: float,
  *,
  warmup_ratio: float = 0.0,
  warmup_steps: int = 0,
  schedule: str = "cosine",
  weight_decay: float = 0.0,
  grad_clip: float = 1.0,
  master_update: str = "exact",
) -> ml_collections.ConfigDict:
  """A phase's optimiser block. `master_update` says how updates land on bfloat16 master weights
  (jaxcap.train.precision): "exact" (round to nearest; needs model.param_dtype float32 at fine-tuning learning
  rates, where most bfloat16 updates round away) or "stochastic_rounding" (unbiased, for bfloat16 masters)."""
  return ml_collections.ConfigDict(
    dict(
      lr=lr,
      warmup_ratio=warmup_ratio,
      warmup_steps=warmup_steps,
      schedule=schedule,
      weight_decay=weight_decay,
      b1=0.9,
      b2=0.999,
      eps=1e-8,
      grad_clip=grad_clip,
      master_update=master_update,
    )
  )


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.name = "run"
  c.seed = 0
  c.workdir = "runs/run"
  # persistent XLA compilation cache, relative to the workdir (or absolute); "" = off. A restart does not recompile.
  c.compile_cache = "compile_cache"
  # Resuming a workdir whose saved config.json differs in a way that alters the run (model, data, reward,
  # optimiser, batch shapes, ...): 'refuse' (list the changes and stop) or 'allow' (continue under them).
  # Changes that do not alter it (more steps, eval / checkpoint cadence, judge endpoints) are always allowed.
  c.resume_changes = "refuse"
  c.mesh = ml_collections.ConfigDict({"shape": {"data": 1, "fsdp": -1, "tensor": 1}})
  c.distributed = ml_collections.ConfigDict(dict(coordinator_address="", num_processes=0, process_id=-1))

  c.model = ml_collections.ConfigDict(
    dict(
      checkpoint="",  # local HF Qwen2.5-VL directory; empty = the tiny embedded student
      dtype="float32",
      param_dtype="float32",
      remat="none",
      logprob_chunk=256,  # LM-head positions per chunk in log-prob passes (lower = less memory, see jaxcap.plan)
      # layer stacks under lax.scan (compile time flat in depth); the tiny embedded student trains ~13% faster on
      # CPU unrolled, so the default unrolls and real checkpoints (real_model_run) scan
      scan_layers=False,
      student=dict(vision_width=128, vision_depth=2, text_width=128, text_layers=3, text_heads=4, rope_theta=10000.0),
    )
  )
  # 1-2 objects per scene: two-object scenes leave the SFT caption one object short for RL to add; with 1-3
  # objects the student perceived less (held-out QA after SFT 33% instead of 41% on 64 images, tower trained).
  c.world = ml_collections.ConfigDict(
    dict(
      train_scenes=1024,
      eval_scenes=256,
      image_size=84,
      min_objects=1,
      max_objects=2,
      clip_fraction=0.0,
      vocab_size=512,
      # CapRL's QA curation on the train split's questions (False keeps leaky ones; held-out is always curated)
      curate_questions=True,
    )
  )
  # Embedded student only (skipped with model.checkpoint): its random ViT first learns, per merged visual token,
  # the colour / shape / size of the object centred in that cell, on freshly drawn scenes (world/vision_warmup.py),
  # standing in for a real VLM's pretrained ViT; SFT then trains the decoder on top of it (sft.freeze_vision).
  # Without it, SFT captions named one stock object in almost every image (colour right in 6 of 64 held-out
  # images); with it, 232 of 256, and held-out QA accuracy after SFT is 52.0% (it was 9.1%).
  c.vision_warmup = ml_collections.ConfigDict(dict(steps=800, batch_size=64, lr=2e-3))
  c.data = ml_collections.ConfigDict(
    dict(
      train_manifest="",
      eval_manifest="",  # JSONL/Parquet; empty = the synthetic world
      prompt="Describe this image in detail.",
      image_size=84,  # every image resized to this square side (pixels); 0 = native size within the pixel budget
      # the pixel budget of native sizes (0: the checkpoint's preprocessor_config.json, as transformers)
      min_pixels=0,
      max_pixels=0,
      pad_to_multiple=16,
      # prompt length and vision packs padded up a ladder of this many sizes per octave (jaxcap.buckets): more
      # pads less and compiles more programs (benchmarks/mixed_sizes.py)
      bucket_steps=2,
      # > 1: each window of this many global batches is sorted by image size before it is cut into batches
      # (jaxcap.train.size_groups): steps of similar sizes pad less; 0 = plain shuffled order
      group_by_size=0,
      # Every image / frame is decoded before training starts (False: only checked to exist). bad_media 'fail':
      # one error listing every record that does not decode; 'skip': train on the rest, the bad ones listed in
      # workdir/media_errors.jsonl (jaxcap/data/media_check.py).
      check_media=True,
      bad_media="fail",
    )
  )
  c.judge = judge_config()  # jaxcap.judges.factory: rule_based, http (an OpenAI-compatible fleet) or factory
  c.reward = ml_collections.ConfigDict({"caprl": {"weight": 1.0, "preset": "paper"}})
  # RubiCap rubrics (used only when reward.rubicap is set). 'policy': RubiCap's stage 1 run at the start of RL,
  # against the captions of the policy being trained (the student whose failures the criteria must name):
  # committee consensus (>= min_agreement of the manifest's teacher_captions) minus what the student's greedy
  # caption gets right, one criterion per failure; stored under workdir/rubrics, reused on resume.
  # 'manifest': the rubrics the manifest rows carry (e.g. from `python -m jaxcap.synthesize_rubrics`).
  c.rubrics = ml_collections.ConfigDict(dict(source="policy", min_agreement=3, batch_size=64))
  c.sampling = ml_collections.ConfigDict(dict(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=48))
  c.sft = ml_collections.ConfigDict(
    dict(
      steps=1600,
      batch_size=16,
      micro_batches=1,
      max_target_tokens=48,  # batch sizes are per process
      targets="incomplete",  # 'incomplete' / 'complete' world captions, or the manifest's 'reference'
      # 'incomplete' names the first k of n objects, k uniform in 1..max_fraction * n: the SFT student names the
      # second object of a two-object scene only sometimes (greedy captions mostly stop after one), which RL
      # can reinforce; with max_fraction 0.5 it never does, and RL had nothing to find.
      max_fraction=1.0,
      optim=optim(2e-3, warmup_steps=20),
      # True: the vision tower gets no updates in this phase. Training it along with the decoder from the
      # warm-up lost much of what the warm-up taught (held-out QA after SFT 41% instead of 53%, 64 images).
      freeze_vision=True,
      # the share of SFT examples that are multiple-choice VQA with the image (one of the record's questions,
      # lettered; target "B. red", jaxcap.processing.vqa) instead of captions: a second skill whose retention the
      # VQA probe (jaxcap.eval.vqa) measures. Drawn per (seed, step, record); records without questions get captions.
      vqa_fraction=0.0,
    )
  )
  c.rl = ml_collections.ConfigDict(
    dict(
      steps=100,
      batch_size=8,
      num_samples=8,
      micro_batches=1,
      estimator="grpo",
      recompute_old_logprobs=True,
      # KL to the SFT policy (k3, as CapRL's paper): without it, an earlier student (no vision warm-up) learned to
      # pad captions with broken text that the answerer mines for facts (held-out QA 9.1% -> 24.7%, captions
      # degenerated); with it QA rose 9.1% -> 25.9% at 28 tokens.
      loss=dict(
        eps_low=0.2,
        eps_high=0.28,
        dual_clip_c=3.0,
        aggregation="token-mean",
        kl_coef=0.05,
        kl_estimator="k3",
        entropy_coef=0.0,
      ),
      length_mask=dict(dims=[], tau_low=0.5, tau_high=2.0),
      # lr 3e-4 drifted (KL 0.4) and lost held-out QA (53% -> 51% on 64 images); 1e-4 gained (53% -> 64%)
      optim=optim(1e-4, warmup_steps=5, schedule="constant"),
      freeze_vision=False,
    )
  )
  # 256 held-out images: on 64, greedy-caption flips moved held-out QA by about 4 points between checkpoints
  # at_start: evaluate before SFT; at_rl_start: before RL (False when many runs share one start, as experiments do)
  c.eval = ml_collections.ConfigDict(dict(every=25, num_images=256, batch_size=64, at_start=False, at_rl_start=True))
  c.checkpoint = ml_collections.ConfigDict(dict(every=25, max_to_keep=2))
  c.export = ml_collections.ConfigDict(dict(hf=True))
  return c


def real_model_run(
  c: ml_collections.ConfigDict, *, max_new_tokens: int, max_pixels: int = 448 * 448, rl: bool = True
) -> None:
  """The settings every `:paper` variant shares: a real Qwen2.5-VL checkpoint (no embedded SFT warm start),
  float32 master weights and optimizer state with bfloat16 compute (as maxtext's weight_dtype / dtype; bfloat16
  masters lose most AdamW updates at lr 1e-6..1e-5, see jaxcap.train.precision) and full remat, images at their
  native size and aspect within `max_pixels` (448 x 448: at most 256 visual tokens per image, what the README's
  memory plan assumes), batches grouped by size, and (for RL) an LLM judge fleet over HTTP with no KL term (BalCapRL states none, CapRL's
  released code uses 0; set rl.loss.kl_coef for the CapRL paper's KL)."""
  c.vision_warmup.steps = 0
  c.sft.freeze_vision = False  # the embedded student's recipe; the papers state no frozen tower
  if rl:
    c.sft.steps = 0
    c.judge.kind = "http"
    c.rl.loss.kl_coef = 0.0
  c.sampling.max_new_tokens = max_new_tokens
  c.data.image_size = 0
  c.data.max_pixels = max_pixels
  c.data.group_by_size = 16
  c.model.update(dict(dtype="bfloat16", param_dtype="float32", remat="full", scan_layers=True))


def validate(c: ml_collections.ConfigDict) -> None:
  """Fails before any compute with a message naming the field and the fix."""
  errors = []

  def need(cond, msg):
    if not cond:
      errors.append(msg)

  for fam, opts in c.reward.items():
    need(fam in REWARD_FAMILIES, REWARD_FAMILIES.check(fam))
    if fam in REWARD_FAMILIES:
      allowed = {"weight", *REWARD_FAMILIES[fam].options}
      for k in opts:
        need(k in allowed, f"reward.{fam}.{k}: unknown option; allowed: {', '.join(sorted(allowed))}")
  need(len(c.reward) > 0 or c.rl.steps == 0, "reward: configure at least one reward family for RL")
  for field, registry in REGISTRIES.items():
    if field != "reward":  # a block of families, checked above
      error = registry.check(functools.reduce(lambda node, key: node[key], field.split("."), c))
      need(error is None, error)
  need(c.rl.num_samples >= 2 or c.rl.steps == 0, f"rl.num_samples={c.rl.num_samples}: group advantages need >= 2")
  for phase in ("sft", "rl"):
    p = c[phase]
    need(p.steps >= 0, f"{phase}.steps={p.steps}: must be >= 0")
    need(p.batch_size >= 1, f"{phase}.batch_size={p.batch_size}: must be >= 1 (records per process per step)")
    need(p.micro_batches >= 1, f"{phase}.micro_batches={p.micro_batches}: must be >= 1 (1 = no accumulation)")
    need(
      p.batch_size < 1 or p.micro_batches < 1 or p.batch_size % p.micro_batches == 0,
      f"{phase}.batch_size={p.batch_size} is not divisible by {phase}.micro_batches={p.micro_batches}",
    )
    need(p.optim.lr > 0, f"{phase}.optim.lr={p.optim.lr}: must be positive")
    _check_optim(need, f"{phase}.optim", p.optim)
    mode = p.optim.get("master_update", "exact")
    need(
      mode in MASTER_UPDATES,
      f"{phase}.optim.master_update={mode!r}: choose one of {', '.join(MASTER_UPDATES)}",
    )
    need(
      p.steps == 0 or c.model.param_dtype != "bfloat16" or mode != "exact",
      f"model.param_dtype='bfloat16' with {phase}.optim.master_update='exact': most AdamW updates at fine-tuning "
      f"learning rates (lr={p.optim.lr}) round away in bfloat16 master weights. Set --config.model.param_dtype="
      f"float32 (float32 masters, keep model.dtype=bfloat16 for compute) or --config.{phase}.optim.master_update="
      "stochastic_rounding",
    )
  need(c.model.dtype in ("float32", "bfloat16"), f"model.dtype={c.model.dtype!r}: use float32 or bfloat16")
  need(c.model.logprob_chunk >= 1, f"model.logprob_chunk={c.model.logprob_chunk}: must be a positive token count")
  need(
    c.model.param_dtype in ("float32", "bfloat16"),
    f"model.param_dtype={c.model.param_dtype!r}: use float32 or bfloat16",
  )
  need(c.model.remat in ("none", "full", "dots"), f"model.remat={c.model.remat!r}: use none, full or dots")
  need(
    c.rubrics.source in ("policy", "manifest"),
    f"rubrics.source={c.rubrics.source!r}: use 'policy' (synthesise against the policy) or 'manifest'",
  )
  need(c.rubrics.min_agreement >= 1, f"rubrics.min_agreement={c.rubrics.min_agreement}: must be >= 1")
  need(c.vision_warmup.steps == 0 or c.vision_warmup.batch_size >= 1, "vision_warmup.batch_size must be >= 1")
  need(c.sampling.max_new_tokens >= 1, "sampling.max_new_tokens must be >= 1")
  need(
    bool(c.data.eval_manifest) or not c.data.train_manifest or c.eval.num_images == 0,
    "data.eval_manifest: set a held-out manifest, or --config.eval.num_images=0 to skip evaluation",
  )
  _check_counts(need, c)
  if errors:
    raise ValueError("invalid config:\n  - " + "\n  - ".join(errors))


def _check_optim(need, name: str, o) -> None:
  need(
    o.schedule in ("cosine", "linear", "constant"), f"{name}.schedule={o.schedule!r}: use cosine, linear or constant"
  )
  need(o.warmup_steps >= 0, f"{name}.warmup_steps={o.warmup_steps}: must be >= 0")
  need(0 <= o.warmup_ratio < 1, f"{name}.warmup_ratio={o.warmup_ratio}: must be in [0, 1)")
  need(o.weight_decay >= 0, f"{name}.weight_decay={o.weight_decay}: must be >= 0")
  need(o.grad_clip >= 0, f"{name}.grad_clip={o.grad_clip}: must be >= 0 (0 = no clipping)")
  need(0 <= o.b1 < 1 and 0 <= o.b2 < 1, f"{name}.b1={o.b1}, b2={o.b2}: Adam's decay rates must be in [0, 1)")
  need(o.eps > 0, f"{name}.eps={o.eps}: must be positive")


def _check_counts(need, c) -> None:
  """Counts, sizes and ranges that would otherwise fail (or divide by zero) minutes into a run."""
  from jaxcap.train.resume import RESUME_CHANGES

  need(
    c.resume_changes in RESUME_CHANGES,
    f"resume_changes={c.resume_changes!r}: use 'refuse' (stop on changes that alter a resumed run) or 'allow'",
  )
  if c.sft.steps > 0:
    need(c.sft.max_target_tokens >= 1, f"sft.max_target_tokens={c.sft.max_target_tokens}: must be >= 1")
    need(0 < c.sft.max_fraction <= 1, f"sft.max_fraction={c.sft.max_fraction}: must be in (0, 1]")
  vqa = c.sft.get("vqa_fraction", 0.0)
  need(
    0 <= vqa < 1,
    f"sft.vqa_fraction={vqa}: must be in [0, 1) (the share of SFT examples that are multiple-choice VQA instead of "
    "captions; 0 = captions only, and some captions must remain)",
  )
  loss = c.rl.loss
  need(0 <= loss.eps_low < 1, f"rl.loss.eps_low={loss.eps_low}: must be in [0, 1)")
  need(loss.eps_high >= 0, f"rl.loss.eps_high={loss.eps_high}: must be >= 0")
  need(
    loss.dual_clip_c is None or loss.dual_clip_c > 1,
    f"rl.loss.dual_clip_c={loss.dual_clip_c}: must exceed 1 (it caps a negative advantage's token loss at c x A)",
  )
  need(loss.kl_coef >= 0, f"rl.loss.kl_coef={loss.kl_coef}: must be >= 0 (0 = no KL term)")
  lm = c.rl.length_mask
  need(
    not lm.dims or 0 <= lm.tau_low < lm.tau_high,
    f"rl.length_mask.tau_low={lm.tau_low}, tau_high={lm.tau_high}: need 0 <= tau_low < tau_high",
  )
  s = c.sampling
  need(s.temperature >= 0, f"sampling.temperature={s.temperature}: must be >= 0 (0 = greedy)")
  need(0 < s.top_p <= 1, f"sampling.top_p={s.top_p}: must be in (0, 1]")
  need(s.top_k >= 0, f"sampling.top_k={s.top_k}: must be >= 0 (0 = off)")
  need(c.eval.every >= 0, f"eval.every={c.eval.every}: must be >= 0 (0 = only at phase ends)")
  need(c.eval.num_images >= 0, f"eval.num_images={c.eval.num_images}: must be >= 0 (0 = no evaluation)")
  need(c.eval.num_images == 0 or c.eval.batch_size >= 1, f"eval.batch_size={c.eval.batch_size}: must be >= 1")
  need(c.checkpoint.every >= 0, f"checkpoint.every={c.checkpoint.every}: must be >= 0 (0 = only at phase ends)")
  need(
    c.checkpoint.max_to_keep >= 1,
    f"checkpoint.max_to_keep={c.checkpoint.max_to_keep}: must be >= 1, or the run cannot resume",
  )
  need(c.data.image_size >= 0, f"data.image_size={c.data.image_size}: must be >= 0 (0 = native size)")
  need(c.data.pad_to_multiple >= 1, f"data.pad_to_multiple={c.data.pad_to_multiple}: must be >= 1")
  lo, hi = c.data.get("min_pixels", 0), c.data.get("max_pixels", 0)
  need(
    lo >= 0 and hi >= 0 and (hi == 0 or lo <= hi),
    f"data.min_pixels={lo}, max_pixels={hi}: need 0 <= min_pixels <= max_pixels (0 = the checkpoint's own)",
  )
  need(c.data.get("bucket_steps", 1) >= 1, f"data.bucket_steps={c.data.get('bucket_steps')}: must be >= 1")
  need(c.data.get("group_by_size", 0) >= 0, f"data.group_by_size={c.data.get('group_by_size')}: must be >= 0")
  need(c.vision_warmup.steps >= 0, f"vision_warmup.steps={c.vision_warmup.steps}: must be >= 0")
  need(c.vision_warmup.steps == 0 or c.vision_warmup.lr > 0, f"vision_warmup.lr={c.vision_warmup.lr}: must be positive")
  need(c.rubrics.batch_size >= 1, f"rubrics.batch_size={c.rubrics.batch_size}: must be >= 1")
  sizes = dict(c.mesh.shape)
  need(
    all(isinstance(v, int) and (v >= 1 or v == -1) for v in sizes.values()) and list(sizes.values()).count(-1) <= 1,
    f"mesh.shape={sizes}: each axis needs a size >= 1, or -1 (the remaining devices) on at most one axis",
  )
  d = c.distributed
  need(
    not d.coordinator_address or 0 <= d.process_id < d.num_processes,
    f"distributed.process_id={d.process_id}, num_processes={d.num_processes}: need 0 <= process_id < num_processes",
  )
  if not c.data.train_manifest:  # the embedded synthetic world
    w = c.world
    need(64 <= w.image_size <= 1024, f"world.image_size={w.image_size}: use 64..1024 pixels")
    need(
      1 <= w.min_objects <= w.max_objects <= 6,
      f"world.min_objects={w.min_objects}, max_objects={w.max_objects}: need 1 <= min_objects <= max_objects <= 6",
    )
    need(0 <= w.clip_fraction <= 1, f"world.clip_fraction={w.clip_fraction}: must be in [0, 1]")
    need(w.eval_scenes >= 0, f"world.eval_scenes={w.eval_scenes}: must be >= 0")
    for phase in ("sft", "rl"):
      need(
        c[phase].steps == 0 or w.train_scenes >= c[phase].batch_size,
        f"world.train_scenes={w.train_scenes} cannot fill one {phase} batch of {phase}.batch_size="
        f"{c[phase].batch_size}; raise world.train_scenes or lower the batch size",
      )
  if not c.model.checkpoint:  # the embedded student (jaxcap.world.student.student_config)
    st = c.model.student
    need(
      min(st.text_layers, st.vision_depth, st.text_heads, st.vision_width, st.text_width) >= 1,
      "model.student: text_layers, vision_depth, text_heads, vision_width and text_width must be >= 1",
    )
    if st.text_heads >= 1:
      need(
        st.text_width % st.text_heads == 0 and (st.text_width // st.text_heads) % 2 == 0,
        f"model.student.text_width={st.text_width} must split into text_heads={st.text_heads} heads of an even size",
      )
      need(
        st.text_heads % max(1, st.text_heads // 2) == 0,
        f"model.student.text_heads={st.text_heads}: the student shares keys over text_heads // 2 groups, which "
        "must divide text_heads (use 1, 3 or an even number)",
      )
    if st.vision_width >= 1:
      heads = max(1, st.vision_width // 32)
      need(
        st.vision_width % heads == 0,
        f"model.student.vision_width={st.vision_width} does not split into its {heads} heads (vision_width // 32); "
        "use a multiple of 32",
      )
