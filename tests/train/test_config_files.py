"""Every config file and variant loads and validates; the `:paper` variants carry the papers' numbers."""

import json

import pytest

from jaxcap.config.run import Run

from jaxcap.config_files import validate
from processes import load_config


def _load(name, variant):
  c = load_config(name, variant)
  if variant == "paper":  # a real run names its data
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


def test_unknown_variant_is_named():
  with pytest.raises(ValueError, match="variant 'papers'"):
    _load("caprl", "papers")
