"""Evaluation config for `python -m jaxcap.eval --config=configs/eval.py`.

Defaults evaluate the synthetic world's reference captions, its five teachers, the weak student and empty
captions with the rule-based judge. For real captioners point `manifest` at a dataset manifest, pick a judge
(judge.kind='http' with judge.endpoints=URL[,URL], or judge.kind='factory' with judge.factory='module:function'
and judge.options={...}; the fields are `jaxcap.judges.settings.JudgeConfig`'s) and pass
--captioner NAME=jsonl:PATH (repeatable; `python -m jaxcap.caption` writes such JSONL files).
"""

import ml_collections

from jaxcap.judges.settings import JudgeConfig


def get_config():
  c = ml_collections.ConfigDict()
  c.manifest = ""  # manifest.jsonl; empty: generate a synthetic world under out_dir/synthetic_world
  # its media must lie in media_root (empty: the manifest's folder) unless allow_outside_paths (jaxcap.data.media_root)
  c.media_root = ""
  c.allow_outside_paths = False
  # 0: every manifest image; N: the first N (a training run's held-out captions cover its first eval.num_images)
  c.num_images = 0
  c.synthetic = dict(num_scenes=24, seed=0, questions_per_scene=5)
  c.out_dir = "eval_report"
  c.judge = JudgeConfig().to_dict()  # jaxcap.judges.factory: rule_based, http (endpoints / fleet_config) or factory
  # NAME=SPEC, compared in this order (specs: builtin:<name>, jsonl:<path>, callable:<module>:<fn>).
  c.captioners = (
    "reference=builtin:reference",
    "teacher_meticulous=builtin:teacher:meticulous",
    "teacher_terse=builtin:teacher:terse",
    "teacher_hallucinating=builtin:teacher:hallucinating",
    "teacher_spatially_confused=builtin:teacher:spatially_confused",
    "teacher_poetic=builtin:teacher:poetic",
    "student=builtin:student",
    "empty=builtin:empty",
  )
  # A JSONL caption that is empty, or a second row for an image: "error" (default) names the image; the opt-ins
  # are empty_captions="score" (scored as written) and duplicate_captions="samples" (each row one more sample).
  c.empty_captions = "error"
  c.duplicate_captions = "error"
  c.samples_per_image = 1  # captions per image drawn from callable captioners (Prism best-of-n / mean)
  c.baselines = {"student": "builtin:student", "meticulous": "builtin:teacher:meticulous"}  # CapArena
  c.honest = "builtin:reference"  # the red team's honest caption; "" skips the red team
  c.suites = "prism,captionqa,dcscore,caparena,redteam"
  c.prism = dict(benchmark_field="kind", shuffle_options=True, max_samples=0, seed=0)
  c.captionqa = dict(word_limits=(50, 100, 200), include_unlimited=True, seed=0)
  c.dcscore = dict(require_pointable=True, empty_caption_precision=0.0)
  c.caparena = dict(with_reference=True)
  c.bcapscore_captionqa_metric = "captionqa/full"
  c.redteam = dict(
    families={
      "caprl": {"caprl": {"preset": "paper"}},
      "caprl_released": {"caprl": {"preset": "released_code", "name": "caprl_released/accuracy"}},
      "rubicap": {"rubicap": {}},
      "balcaprl": {"balcaprl": {}},
      "likert_direct": {"likert_direct": {}},
      "likert_reference": {"likert_reference": {}},
    },
    length_masked_rewards=("balcaprl/linguistic",),
    tau_low=0.5,
    tau_high=2.0,
    hallucinated_objects=3,
    filler_min_words=250,
  )
  # VQA probe (jaxcap.eval.vqa_probe): local HF checkpoints ("NAME=PATH,NAME=PATH"; "" = none) answer the manifest's
  # questions with the image; accuracy per checkpoint and paired differences against the first go in the report.
  # image_size: square side as training's data.image_size (0 = native); system: "checkpoint" (as it was trained: a
  # jaxcap export says so in jaxcap_prompt.json, else Qwen's default turn), "default", "none" or the text.
  # dtype: the weights held as stored ("checkpoint": bf16 for released checkpoints), or "float32" / "bfloat16".
  c.vqa_probe = dict(checkpoints="", batch_size=16, image_size=0, system="checkpoint", dtype="checkpoint")
  c.compare_to = ""  # report paired differences against this captioner; "" = the first listed, "none" = skip
  c.bootstrap = dict(resamples=1000, confidence=0.95, seed=0)
  return c
