"""The run config's typed schema (jaxcap.config): the defaults it produces, what validate() refuses and how each
refusal names the field and the fix, and the resume policy every field declares."""

import dataclasses
import json

import pytest

from jaxcap.config import schema
from jaxcap.config.changes import flatten
from jaxcap.choices import REMAT_POLICIES
from jaxcap.fields import ALLOWED, ALTERS, POLICIES, SHAPE, docs, lookup
from jaxcap.config.run import Run
from jaxcap.judges.settings import JudgeConfig
from jaxcap.models.layers import remat
from jaxcap.config_files import base_config, optim, validate

OPTIM = ["b1", "b2", "eps", "grad_clip", "lr", "master_update", "schedule", "warmup_ratio", "warmup_steps"]
OPTIM += ["weight_decay"]
# The key set of base_config() before the schema existed: a field added or removed here is a deliberate change.
KEYS = {
  "": ["compile_cache", "name", "resume_changes", "seed", "workdir"],
  "checkpoint": ["every", "max_to_keep"],
  "data": ["allow_outside_paths", "bad_media", "bucket_steps", "check_media", "eval_manifest", "group_by_size"]
  + ["image_size", "max_pixels", "media_root", "min_pixels", "pad_to_multiple", "prompt", "train_manifest"]
  + ["video_fps", "video_max_frames", "video_max_pixels", "video_min_frames", "video_min_pixels", "video_total_pixels"],
  "distributed": ["coordinator_address", "num_processes", "process_id"],
  "eval": ["at_rl_start", "at_start", "batch_size", "every", "num_images"],
  "export": ["hf", "peft"],
  "judge": ["api_key_env", "endpoints", "factory", "failure_patience", "failure_rate", "fleet_config", "kind"]
  + ["max_concurrency", "min_valid_fraction", "model", "options", "preflight", "prompt_dir", "seed", "send_images"]
  + ["structured_output", "timeout_s"],
  "judge.answerer": ["max_tokens", "no_letter", "temperature", "template", "video_template"],
  "mesh.shape": ["data", "fsdp", "tensor"],
  "model": ["checkpoint", "dtype", "family", "logprob_chunk", "param_dtype", "remat", "scan_layers", "share_prompt"],
  "model.lora": ["alpha", "dropout", "rank", "targets", "vision", "weight_qtype"],
  "model.student": ["rope_theta", "text_heads", "text_layers", "text_width", "vision_depth", "vision_width"],
  "reward.caprl": ["preset", "weight"],
  "rl": ["batch_size", "estimator", "filter_groups", "filter_groups_max_extra", "freeze_vision", "mask_truncated"]
  + ["micro_batch_tokens", "max_staleness", "micro_batches", "num_samples", "packing_min_saving"]
  + ["partial_rollouts", "recompute_old_logprobs", "steps", "stream_judging"],
  "rl.length_mask": ["dims", "tau_high", "tau_low"],
  "rl.loss": ["aggregation", "clip_cov_lb", "clip_cov_ratio", "clip_cov_ub", "dual_clip_c", "entropy_coef"]
  + ["eps_high", "eps_low", "kl_coef", "kl_cov_coef", "kl_cov_ratio", "kl_estimator", "policy", "tau_neg", "tau_pos"],
  "rl.overlong": ["buffer", "penalty"],
  "rl.rollout_correction": ["is_level", "is_threshold", "reject", "reject_lower", "reject_upper"],
  "logging": ["curves", "mlflow_uri", "project", "rollout_groups", "rollout_max_chars", "rollouts_every", "trackers"],
  "rl.optim": OPTIM,
  "rollout": ["attention", "devices", "engine", "page_size", "pages", "segment_steps", "slots"],
  "rubrics": ["batch_size", "min_agreement", "source"],
  "sampling": ["max_new_tokens", "temperature", "top_k", "top_p"],
  "sft": ["batch_size", "freeze_vision", "max_fraction", "max_target_tokens", "micro_batch_tokens", "micro_batches"]
  + ["packing_min_saving", "steps", "targets", "vqa_fraction"],
  "sft.optim": OPTIM,
  "train": ["collapse_steps", "max_skips", "max_update_ratio", "on_nonfinite"],
  "vision_warmup": ["batch_size", "lr", "steps"],
  "world": ["clip_fraction", "curate_questions", "eval_scenes", "image_size", "max_objects", "min_objects"]
  + ["train_scenes", "vocab_size"],
}


def _errors(data) -> str:
  with pytest.raises(ValueError) as e:
    validate(data)
  assert str(e.value).startswith("invalid config:\n  - ")
  return str(e.value)


def test_defaults_keep_the_key_set_and_the_values_with_their_types():
  d = base_config().to_dict()
  assert set(flatten(d)) == {f"{at}.{k}" if at else k for at, keys in KEYS.items() for k in keys}
  pinned = {
    "sft.optim.lr": 2e-3,
    "sft.optim.warmup_steps": 20,
    "rl.optim.schedule": "constant",
    "rl.loss.eps_high": 0.28,
    "model.student.rope_theta": 10000.0,
    "world.max_objects": 2,
    "mesh.shape.fsdp": -1,
    "reward.caprl.preset": "paper",
    "rl.length_mask.dims": [],
    "judge.options": {},
    "resume_changes": "refuse",
  }
  flat = flatten(d)
  for key, value in pinned.items():
    assert (flat[key], type(flat[key])) == (value, type(value)), key
  # ints stay ints and floats floats (1 == 1.0 would hide a changed type)
  assert json.dumps(d, sort_keys=True) == json.dumps(schema.defaults(), sort_keys=True)
  validate(base_config())


def test_the_judge_block_is_the_judges_settings():
  """The run config's judge block is the class the judge factory, the evaluation and the judge CLIs take
  (jaxcap.judges.settings.JudgeConfig): one declaration, no second set of defaults to drift."""
  assert type(Run().judge) is JudgeConfig and type(schema.validate(base_config()).judge) is JudgeConfig


def test_optim_builds_the_schemas_block():
  o = optim(1e-5, warmup_ratio=0.01, master_update="stochastic_rounding")
  assert sorted(o) == OPTIM and (o.lr, o.warmup_ratio, o.master_update) == (1e-5, 0.01, "stochastic_rounding")
  assert o.to_dict() == {**base_config().rl.optim.to_dict(), **o.to_dict()}  # the same fields as a phase's block


def test_unknown_key_is_named_with_the_closest_field():
  c = base_config()
  c.rl.num_sample = 4
  c.sampling.temprature = 0.7
  msg = _errors(c)
  assert "rl.num_sample:" in msg and "rl.num_samples" in msg and "did you mean" in msg
  assert "sampling.temprature:" in msg and "sampling.temperature" in msg


def test_wrong_types_are_named_with_the_type_wanted():
  d = base_config().to_dict()
  d["sampling"]["top_k"] = "4"
  d["eval"]["at_start"] = 1
  d["rl"]["loss"] = 0.2
  d["rl"]["length_mask"]["dims"] = "balcaprl/linguistic"
  msg = _errors(d)
  assert "sampling.top_k='4': must be an integer" in msg
  assert "eval.at_start=1: must be True or False" in msg
  assert "rl.loss=0.2: must be a block" in msg and "kl_coef" in msg
  assert "rl.length_mask.dims='balcaprl/linguistic': must be a list" in msg


def test_missing_field_is_named():
  d = base_config().to_dict()
  del d["rl"]["loss"]["kl_coef"]
  msg = _errors(d)
  assert "rl.loss.kl_coef: missing field" in msg and "base_config" in msg


@pytest.mark.parametrize(
  "key, value, fix",
  [
    ("rl.num_samples", 1, ">= 2"),
    ("sampling.top_p", 1.5, "(0, 1]"),
    ("rl.loss.eps_low", 1.0, "[0, 1)"),
    ("sft.optim.lr", 0.0, "positive"),
    ("model.remat", "some", "dots"),
    ("data.bad_media", "drop", "skip"),
    ("judge.kind", "gpt", "http"),
    ("mesh.shape.expert", 2, "tensor"),
    ("world.image_size", 32, "64..1024"),
    ("rl.loss.policy", "grpo", "choose one of ppo, gspo"),
    ("rl.loss.tau_neg", 0.0, "positive"),
    ("rl.loss.clip_cov_lb", 6.0, "need clip_cov_lb < clip_cov_ub"),
    ("rl.rollout_correction.is_level", "seq", "use none, token or sequence"),
    ("rl.rollout_correction.reject", "token_k4", "token_k1"),
    ("rl.overlong.buffer", 49, "must not exceed sampling.max_new_tokens=48"),
    ("rl.filter_groups_max_extra", -8, ">= 0"),
    ("rl.filter_groups", "", "use off, spread or a reward dimension's name"),
    ("rl.max_staleness", -1, ">= 0"),
    ("rollout.devices", 2, "set rl.max_staleness >= 1"),
    ("rl.micro_batch_tokens", -1, ">= 0"),
    ("rl.micro_batch_tokens", 48, "must exceed sampling.max_new_tokens=48"),
    ("sft.micro_batch_tokens", 48, "must exceed sft.max_target_tokens=48"),
    ("model.lora.rank", -1, ">= 0"),
    ("model.lora.dropout", 0.1, "set model.lora.dropout=0"),
    ("model.lora.targets", ["q_proj", "lm_head"], "unknown module name(s) lm_head"),
    ("model.lora.weight_qtype", "fp8", "nf4"),
  ],
)
def test_out_of_range_value_is_named_with_the_fix(key, value, fix):
  c = base_config()
  *path, leaf = key.split(".")
  node = c
  for k in path:
    node = node[k]
  node[leaf] = value
  msg = _errors(c)
  assert msg.count("\n  - ") == 1, msg  # only this one
  assert f"{'mesh.shape' if key.startswith('mesh') else key}=" in msg and fix in msg, msg


def test_every_error_is_reported_at_once():
  c = base_config()
  c.rl.batch_size, c.rl.micro_batches = 6, 4
  c.rl.length_mask.dims = ["balcaprl/linguistic"]
  c.rl.length_mask.tau_low = 3.0
  c.model.student.text_heads = 5
  c.checkpoint.max_to_keep = 0
  msg = _errors(c)
  for field in ("rl.batch_size", "rl.length_mask.tau_low", "model.student.text_heads", "checkpoint.max_to_keep"):
    assert field in msg
  assert msg.count("\n  - ") >= 4


def test_checks_apply_only_where_the_field_is_used():
  c = base_config()
  c.rl.steps, c.rl.num_samples = 0, 1  # no RL: no groups
  c.eval.num_images, c.eval.batch_size = 0, 0  # no evaluation
  c.vision_warmup.steps, c.vision_warmup.lr = 0, 0.0
  c.rl.length_mask.tau_low = 3.0  # no masked dimension
  validate(c)
  c = base_config()
  c.data.train_manifest, c.data.eval_manifest = "train.jsonl", "heldout.jsonl"
  c.world.image_size, c.world.min_objects = 16, 9  # no synthetic world
  c.model.checkpoint, c.model.student.text_heads = "/ckpt", 5  # no embedded student
  validate(c)
  c.data.eval_manifest = ""
  assert "data.eval_manifest" in _errors(c) and "eval.num_images=0" in _errors(c)


def test_qlora_on_the_embedded_students_sft_is_refused():
  """The embedded student has no pretrained base: its SFT trains the base, which QLoRA would hold as integers."""
  c = base_config()
  c.model.lora.rank, c.model.lora.weight_qtype = 4, "nf4"
  msg = _errors(c)
  assert (
    "model.lora.weight_qtype='nf4': the embedded student" in msg and "sft.steps=0" in msg and msg.count("\n  - ") == 1
  )
  c.sft.steps = 0  # RL trains the adapters only
  validate(c)
  c.sft.steps, c.model.checkpoint = 2, "/ckpt"  # a pretrained base: SFT trains the adapters
  validate(c)


# what ml_collections makes of `--config.model.lora.targets=...` (a tuple field): a literal is parsed, anything else
# is one string
@pytest.mark.parametrize("given", [("q_proj,in_proj_qkv",), ("(q_proj, in_proj_qkv)",), ("q_proj", "in_proj_qkv")])
def test_a_list_of_names_from_the_command_line(given):
  """A list-of-names field given as "a,b" or "(a, b)" on a command line: the typed config has the names."""
  c = base_config()
  c.model.lora.targets = given
  assert list(schema.validate(c).model.lora.targets) == ["q_proj", "in_proj_qkv"]


def test_a_one_layer_qwen35_student_is_refused():
  """A hybrid decoder needs a layer of each kind: one layer would leave a stack empty."""
  c = base_config()
  c.model.family, c.model.student.text_layers = "qwen3_5", 1
  msg = _errors(c)
  assert "model.student.text_layers=1" in msg and "at least 2" in msg and msg.count("\n  - ") == 1
  c.model.student.text_layers = 2
  validate(c)


def test_filter_groups_budget_is_whole_batches_and_needs_the_filter():
  c = base_config()
  c.rl.filter_groups, c.rl.filter_groups_max_extra = "spread", 12  # rl.batch_size 8
  msg = _errors(c)
  assert "rl.filter_groups_max_extra=12" in msg and "multiple of rl.batch_size=8" in msg and msg.count("\n  - ") == 1
  c.rl.filter_groups_max_extra = 16
  validate(c)
  c.rl.filter_groups = "off"
  assert "does nothing with rl.filter_groups=off" in _errors(c)
  c.rl.filter_groups, c.rl.filter_groups_max_extra = "caprl/accuracy", 0  # a dimension's name: checked at build
  validate(c)


def test_max_staleness_does_not_combine_with_the_group_filter_yet():
  c = base_config()
  c.rl.max_staleness = 1
  validate(c)
  c.rl.filter_groups = "spread"
  msg = _errors(c)
  assert "rl.max_staleness=1 does not combine with rl.filter_groups='spread'" in msg and msg.count("\n  - ") == 1


def test_partial_rollouts_name_what_they_need():
  c = base_config()
  c.rl.partial_rollouts, c.rl.max_staleness = True, 1
  msg = _errors(c)
  assert "rl.partial_rollouts=True needs rl.max_staleness >= 2" in msg
  assert "rl.partial_rollouts=True needs rollout.engine=paged" in msg and msg.count("\n  - ") == 2
  c.rl.max_staleness, c.rl.stream_judging, c.rollout.engine = 2, True, "paged"
  validate(c)


def test_the_old_name_of_max_staleness_is_named_with_the_new_one():
  c = base_config()
  c.rl.off_policy_steps = 1
  msg = _errors(c)
  assert "rl.off_policy_steps: renamed rl.max_staleness; the same value means the same schedule" in msg


def test_packed_micro_batches_run_on_one_process():
  c = base_config()
  c.rl.micro_batch_tokens = 512
  validate(c)
  c.distributed.num_processes = 2
  msg = _errors(c)
  assert "rl.micro_batch_tokens > 0 runs on one process" in msg and "rl.micro_batch_tokens=0" in msg, msg
  c.rl.steps = 0  # no RL: not used
  validate(c)


def test_schema_validate_returns_the_typed_frozen_config():
  run = schema.validate(base_config())
  assert isinstance(run, Run) and run.rl.loss.kl_coef == base_config().rl.loss.kl_coef
  with pytest.raises(dataclasses.FrozenInstanceError):
    run.rl.steps = 5


def test_every_field_declares_a_doc_and_a_resume_policy():
  for key in flatten(base_config().to_dict()):
    f, owner = lookup(Run, key)
    assert f is not None, key
    assert schema.resume_policy(key) in POLICIES, key
  declared = list(docs(Run))

  def field_of(key):  # keys below a dict field belong to it
    return next((p for p in ("reward", "mesh.shape") if key.startswith(p + ".")), key)

  assert {path for path, _, _ in declared} == {field_of(k) for k in flatten(base_config().to_dict())}
  for path, policy, doc in declared:
    assert doc and policy in POLICIES, path


def test_resume_policies_of_the_schema():
  assert {schema.resume_policy(k) for k in flatten(base_config().to_dict()) if k.startswith("model.student.")} == {
    SHAPE
  }
  assert schema.resume_policy("world.vocab_size") == SHAPE
  for key in ("model.lora.rank", "model.lora.targets", "model.lora.weight_qtype"):  # they change the params' tree
    assert schema.resume_policy(key) == SHAPE, key
  assert schema.resume_policy("model.lora.alpha") == ALTERS
  allowed = ("rl.steps", "eval.every", "checkpoint.max_to_keep", "mesh.shape.fsdp", "judge.endpoints", "model.remat")
  for key in (*allowed, "rl.micro_batch_tokens", "rl.packing_min_saving", "sft.packing_min_saving"):
    assert schema.resume_policy(key) == ALLOWED, key
  for key in ("seed", "rl.optim.lr", "reward.caprl.preset", "reward.rubicap", "model.dtype", "judge.kind") + (
    "rl.filter_groups",
    "rl.filter_groups_max_extra",
  ):
    assert schema.resume_policy(key) == ALTERS, key
  for key in ("data.max_pixels", "data.video_fps", "data.video_max_frames", "data.video_total_pixels"):
    assert schema.resume_policy(key) == ALTERS, key  # they change what the model sees
  # a key the schema no longer has takes its block's policy (a field since removed from eval still may change)
  assert (schema.resume_policy("eval.removed"), schema.resume_policy("rl.removed")) == (ALLOWED, ALTERS)


def test_choice_lists_are_shared_with_the_code_that_acts_on_them():
  model_fields = {f.name: f for f in dataclasses.fields(Run().model)}
  assert model_fields["remat"].metadata["choices"] is REMAT_POLICIES
  for policy in REMAT_POLICIES:
    remat(lambda x: x, policy)
  with pytest.raises(ValueError, match="remat='some'"):
    remat(lambda x: x, "some")


def test_each_knob_is_declared_once_and_the_builders_pass_every_field():
  """The runtime classes (PolicyLossConfig, RolloutCorrectionConfig, SamplingConfig, EngineConfig) hold the defaults
  the schema's blocks show, and the one builder of each (jaxcap.train.steps.programs) hands it every field: a run
  whose every such field differs from its default gets a runtime object with every field changed."""
  from jaxcap.rl import PolicyLossConfig
  from jaxcap.rl.rollout_correction import RolloutCorrectionConfig
  from jaxcap.sampling import SamplingConfig
  from jaxcap.sampling.engine import EngineConfig
  from jaxcap.train.steps import programs

  run = Run()
  pairs = [
    (run.rl.loss, PolicyLossConfig()), (run.rl.rollout_correction, RolloutCorrectionConfig()),
    (run.sampling, SamplingConfig()), (dataclasses.replace(run.rollout, engine="paged"), EngineConfig()),
  ]  # fmt: skip
  for block, runtime in pairs:
    shared = [f.name for f in dataclasses.fields(block) if hasattr(runtime, f.name)]
    assert shared and all(getattr(block, n) == getattr(runtime, n) for n in shared), type(block).__name__
  changed = {
    "rl.loss": dict(policy="gspo", eps_low=0.1, eps_high=0.3, dual_clip_c=4.0, aggregation="seq-mean-token-sum",
                    kl_coef=0.2, kl_estimator="k1", entropy_coef=0.01, tau_pos=0.9, tau_neg=1.1, clip_cov_ratio=0.1,
                    clip_cov_lb=0.5, clip_cov_ub=6.0, kl_cov_ratio=0.1, kl_cov_coef=0.2),
    "rl.rollout_correction": dict(is_level="token", is_threshold=3.0, reject="token_k1", reject_upper=3.0,
                                  reject_lower=0.5),
    "sampling": dict(temperature=0.7, top_p=0.9, top_k=5, max_new_tokens=99),
    "rollout": dict(engine="paged", slots=7, page_size=8, segment_steps=9, pages=10, attention="reference"),
  }  # fmt: skip
  for block, values in changed.items():
    for name, value in values.items():
      run = schema.replaced(run, {f"{block}.{name}": value})
  built = {
    "rl.loss": programs.policy_loss_config(run),
    "rl.rollout_correction": programs.rollout_correction_config(run),
    "sampling": programs.sampling_config(run),
    "rollout": programs.rollout_engine(run),
  }
  for block, values in changed.items():
    for name, value in values.items():
      if name != "engine":
        assert getattr(built[block], name) == value, f"{block}.{name}"
