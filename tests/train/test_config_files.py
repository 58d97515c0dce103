"""Every config file and variant loads and validates; the `:paper` variants carry the papers' numbers."""

import json

import pytest

from jaxcap.config.run import Run

from jaxcap.config_files import validate
from processes import load_config


def _load(name, variant):
  c = load_config(name, variant)
  if variant != "default":  # a real run names its data
    c.data.train_manifest, c.data.eval_manifest = "train.jsonl", "heldout.jsonl"
  return c


@pytest.mark.parametrize("name", ["caprl", "rubicap", "balcaprl", "caprl_video", "sft"])
@pytest.mark.parametrize("variant", ["default", "paper"])
def test_config_validates(name, variant):
  """Each file's variant parses into the typed run config the trainer takes, carrying every value the file sets
  (none dropped, none coerced: ints stay ints, lists lists)."""
  c = _load(name, variant)
  run = validate(c)
  assert isinstance(run, Run)
  assert json.dumps(run.to_dict(), sort_keys=True) == json.dumps(c.to_dict(), sort_keys=True)


def test_paper_hyper_parameters():
  r = _load("rubicap", "paper")
  assert (r.rl.optim.lr, r.rl.optim.warmup_ratio, r.rl.optim.schedule, r.rl.num_samples) == (1e-5, 0.01, "cosine", 4)
  b = _load("balcaprl", "paper")
  assert (b.rl.optim.lr, b.rl.num_samples, b.rl.batch_size, b.rl.estimator) == (5e-6, 8, 256, "c_gdpo")
  assert b.rl.length_mask.dims == ["balcaprl/linguistic"] and (b.rl.length_mask.tau_low, b.rl.length_mask.tau_high) == (
    0.5,
    2.0,
  )
  c = _load("caprl", "paper")
  assert (c.rl.estimator, c.rl.optim.lr, c.rl.loss.kl_coef, c.reward.caprl.preset) == (
    "rloo",
    1e-6,
    0.0,
    "released_code",
  )
  for cfg in (r, b, c):
    assert cfg.sampling.max_new_tokens >= 1024 and cfg.judge.kind == "http" and cfg.sft.steps == 0
  s = _load("sft", "paper")
  for cfg in (r, b, c, s):  # the vision warm-up and the frozen tower are the embedded student's recipe
    assert cfg.vision_warmup.steps == 0 and not cfg.sft.freeze_vision


@pytest.mark.parametrize(
  "name, variant", [("caprl", "released"), ("caprl", "released_plus"), ("caprl_video", "released")]
)
def test_released_variants_validate(name, variant):
  c = _load(name, variant)
  assert json.dumps(validate(c).to_dict(), sort_keys=True) == json.dumps(c.to_dict(), sort_keys=True)


def test_released_presets_carry_the_released_scripts_numbers():
  """The numbers of docs/recipes.md's table: CapRL (OpenRLHF launcher) and CapRL++ (verl train_caprl.sh, serve_rm)."""
  v1 = _load("caprl", "released")
  assert (v1.rl.estimator, v1.rl.optim.lr, v1.rl.optim.warmup_steps, v1.rl.optim.schedule) == (
    "rloo",
    1e-6,
    20,
    "constant",
  )
  assert (v1.rl.batch_size, v1.rl.num_samples, v1.sampling.max_new_tokens, v1.sampling.temperature) == (
    128,
    8,
    4096,
    1.0,
  )
  assert v1.reward.to_dict() == {"caprl": {"weight": 1.0, "preset": "caprl"}}
  assert v1.data.prompt == "Please describe this image in detail."
  assert (v1.rl.loss.eps_low, v1.rl.loss.eps_high, v1.rl.loss.dual_clip_c, v1.rl.loss.kl_coef) == (0.2, 0.2, None, 0.0)
  for name, variant, video in (("caprl", "released_plus", False), ("caprl_video", "released", True)):
    c = _load(name, variant)
    assert (c.rl.optim.lr, c.rl.optim.warmup_steps, c.rl.optim.schedule) == (1e-5, 20, "constant")
    assert (c.rl.batch_size, c.rl.num_samples, c.sampling.max_new_tokens) == (128, 8, 4096)
    assert (c.rl.loss.aggregation, c.rl.recompute_old_logprobs, c.rl.loss.dual_clip_c) == (
      "seq-mean-token-mean",
      False,
      3.0,
    )
    weights = {k: v["weight"] for k, v in c.reward.to_dict().items()}
    assert weights == {"caprl": 1.0, "caption_length": 0.2, **({"timestamp_format": 0.2} if video else {})}
    assert c.reward.caprl.preset == "caprl_plus" and (
      c.reward.caption_length.full_until,
      c.reward.caption_length.zero_at,
    ) == (2048, 3072)
  for c in (v1, _load("caprl", "released_plus"), _load("caprl_video", "released")):
    a = c.judge.answerer
    assert (a.template, a.temperature, a.max_tokens, a.no_letter) == ("caprl_released", 0.6, 10, "wrong")
  assert _load("caprl_video", "released").judge.answerer.video_template == "caprl_released_video"


def test_unknown_variant_is_named():
  with pytest.raises(ValueError, match="variant 'papers'"):
    _load("caprl", "papers")
