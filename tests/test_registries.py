"""The extension points: one registry each, read by validate(), the factories and the CLIs; adding an entry is one
function + one decorator (the examples of docs/extending.md, run here)."""

import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxcap
from jaxcap import rl
from jaxcap.data.records import ImageRecord
from jaxcap.registry import Registry
from jaxcap.rewards import REWARD_FAMILIES, LengthMaskedReward, build_reward, reward_family
from jaxcap.rewards.batch import make_batch
from jaxcap.config_files import REGISTRIES, base_config, validate
from loss_configs import plain_loss


@pytest.fixture
def scratch():
  """Registers entries for one test and removes them afterwards."""
  added = []
  yield lambda registry, name: added.append((registry, name))
  for registry, name in added:
    registry._entries.pop(name, None)


def test_registry_rejects_unknown_and_duplicate_names():
  r = Registry("colour", field="paint.colour")
  r.register("red", 1)
  assert r["red"] == 1 and list(r) == ["red"] and "red" in r and r.check("red") is None
  with pytest.raises(ValueError, match=r"paint.colour='blue': unknown colour; choose one of red"):
    r["blue"]
  with pytest.raises(ValueError, match="registered twice"):
    r.register("red", 2)


def test_a_new_advantage_estimator_is_one_function_and_one_decorator(scratch):
  @rl.ADVANTAGE_ESTIMATORS.register("mean_baseline")
  def mean_baseline(rewards, weights, valid=None):
    total, ok = rl.weighted_reward(rewards, weights, valid if valid is not None else jnp.ones(rewards.shape, bool))
    adv = total - total.mean(axis=1, keepdims=True)
    return rl.Advantages(adv, ok, {})

  scratch(rl.ADVANTAGE_ESTIMATORS, "mean_baseline")
  rewards = jnp.asarray([[[1.0], [0.0], [0.5]]])
  out = rl.group_advantages(rewards, jnp.ones(1), estimator="mean_baseline")
  np.testing.assert_allclose(out.advantages, [[0.5, -0.5, 0.0]])
  c = base_config()
  c.rl.estimator = "mean_baseline"
  validate(c)  # the config accepts what the registry holds
  c.rl.estimator = "nope"
  with pytest.raises(ValueError, match="rl.estimator='nope': unknown advantage estimator; choose one of grpo"):
    validate(c)


def test_a_new_policy_loss_is_one_function_and_one_decorator(scratch):
  """docs/extending.md's example: REINFORCE with the ratio's detached value; on-policy it is the gpg loss."""

  @rl.register_policy_loss("reinforce")
  def reinforce(x):
    token_loss = -x.adv * jax.lax.stop_gradient(x.ratio) * x.logprobs
    return rl.Surrogate(token_loss if x.is_weights is None else token_loss * x.is_weights, {})

  scratch(rl.POLICY_LOSSES, "reinforce")
  lp = jnp.log(jnp.asarray([[0.5, 0.25], [0.8, 0.1]]))
  args = (lp, lp, jnp.asarray([1.0, -2.0]), jnp.ones((2, 2)))
  ours = rl.policy_loss(*args, plain_loss(policy="reinforce"))[0]
  np.testing.assert_allclose(ours, rl.policy_loss(*args, plain_loss(policy="gpg"))[0], rtol=1e-6)
  c = base_config()
  c.rl.loss.policy = "reinforce"
  validate(c)
  c.rl.loss.policy = "nope"
  with pytest.raises(ValueError, match="rl.loss.policy='nope': unknown policy loss; choose one of ppo"):
    validate(c)


def test_a_new_reward_family_is_one_function_and_one_decorator(scratch):
  @reward_family("word_target", options=("target_words",))
  def word_target_reward(judge, *, target_words=10):
    def reward(captions, records, *, step=0):
      values = [[min(len(c.split()) / target_words, 1.0)] for c in captions]
      return make_batch(("length/score",), values, np.ones((len(captions), 1), bool), [1.0], captions, records, {})

    reward.names = ("length/score",)
    return reward

  scratch(REWARD_FAMILIES, "word_target")
  records = [ImageRecord(id="a", image="a.png")] * 2
  batch = build_reward({"word_target": {"weight": 2.0, "target_words": 4}}, judge=None)(["a b", "a b c d e"], records)
  np.testing.assert_allclose(batch.values[:, 0], [0.5, 1.0])
  np.testing.assert_allclose(batch.weights, [2.0])
  c = base_config()
  c.reward = {"word_target": {"target_words": 4}}
  validate(c)
  c.reward = {"word_target": {"words": 4}}
  with pytest.raises(ValueError, match=r"reward.word_target.words: unknown option; allowed: target_words, weight"):
    validate(c)


def test_every_config_choice_is_validated_against_its_registry():
  c = base_config()
  for field in REGISTRIES:
    if field == "reward":
      continue
    *section, name = field.split(".")
    node = c
    for key in section:
      node = node[key]
    node[name] = "no-such-entry"
  with pytest.raises(ValueError) as e:
    validate(c)
  for field, registry in REGISTRIES.items():
    if field != "reward":
      assert f"{field}='no-such-entry': unknown {registry.kind}; choose one of {', '.join(registry)}" in str(e.value)
  assert set(REGISTRIES["reward"]) >= {"caprl", "rubicap", "balcaprl", "likert_direct", "likert_reference"}
  assert set(REGISTRIES["sft.targets"]) == {"reference", "incomplete", "complete"}


class _Fixed:
  names = ("a", "b")

  def __init__(self, values):
    self.values = np.asarray(values, np.float32)

  def __call__(self, captions, records, *, step=0):
    valid = np.ones(self.values.shape, bool)
    return make_batch(self.names, self.values, valid, [1.0, 1.0], captions, records, {})


def test_length_mask_wrapper_zeroes_only_the_named_dimension_outside_the_band():
  # reference of 4 words; band [0.5, 2.0] words ratio -> 2..8 words pass
  records = [ImageRecord(id="x", image="x.png", reference_caption="one two three four")]
  captions = ["w", "w w", "w w w w w w w w", "w w w w w w w w w"]  # 1, 2, 8, 9 words
  inner = _Fixed([[0.9, 0.8]] * 4)
  batch = LengthMaskedReward(inner, ["b"], tau_low=0.5, tau_high=2.0)(captions, records * 4)
  np.testing.assert_allclose(batch.values, [[0.9, 0.0], [0.9, 0.8], [0.9, 0.8], [0.9, 0.0]])
  assert batch.valid.all()  # an out-of-band caption earned 0 there; it is not a failed judgment
  assert batch.extras == {"length/in_band": 0.5}
  with pytest.raises(ValueError, match=r"rl.length_mask.dims \['c'\] are not rewards of this run"):
    LengthMaskedReward(inner, ["c"], tau_low=0.5, tau_high=2.0)


@pytest.mark.slow
def test_every_module_imports_on_its_own():
  """No import cycles: each jaxcap module imports first, in a fresh interpreter state for jaxcap."""
  names = [m.name for m in pkgutil.walk_packages(jaxcap.__path__, "jaxcap.") if not m.name.endswith("__main__")]
  script = (
    "import importlib, sys\n"
    f"for name in {names!r}:\n"
    "  for k in [k for k in sys.modules if k == 'jaxcap' or k.startswith('jaxcap.')]:\n"
    "    del sys.modules[k]\n"
    "  importlib.import_module(name)\n"
    f"print('imported', {len(names)})\n"
  )
  out = subprocess.run(
    [sys.executable, "-c", script], capture_output=True, text=True, timeout=600, cwd=Path(__file__).resolve().parents[1]
  )
  assert out.returncode == 0, out.stderr[-3000:]
  assert f"imported {len(names)}" in out.stdout and len(names) > 60
  assert importlib.import_module("jaxcap.rewards").REWARD_FAMILIES is REWARD_FAMILIES


def test_readme_extending_examples_run_as_written(scratch):
  import re

  page = (Path(__file__).resolve().parents[1] / "docs" / "extending.md").read_text()
  blocks = re.findall(r"```python\n(.*?)```", page, re.S)
  assert len(blocks) == 3
  for code in blocks:
    exec(compile(code, "docs/extending.md", "exec"), {})
  scratch(rl.ADVANTAGE_ESTIMATORS, "mean_baseline")
  scratch(rl.POLICY_LOSSES, "reinforce")
  scratch(REWARD_FAMILIES, "word_target")
  c = base_config()
  c.rl.estimator = "mean_baseline"
  c.rl.loss.policy = "reinforce"
  c.reward = {"word_target": {"weight": 0.5, "target_words": 40}}
  validate(c)
  out = rl.group_advantages(jnp.asarray([[[1.0], [3.0]]]), jnp.ones(1), estimator="mean_baseline")
  np.testing.assert_allclose(out.advantages, [[-1.0, 1.0]])
  records = [ImageRecord(id="a", image="a.png")]
  batch = build_reward(c.reward.to_dict(), judge=None)(["twenty words " * 10], records)
  np.testing.assert_allclose(batch.values, [[0.5]])
