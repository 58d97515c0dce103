"""The trainer's memory check (jaxcap.train.shell.memory_check): the footprint's parts counted by hand on the tiny model,
and a run that cannot fit refused before its checkpoint is read, with the numbers and settings that would fit."""

import numpy as np
import pytest

import jaxcap.models as M
from jaxcap.config import schema
from jaxcap.config.cli import ConfigError
from jaxcap.sampling.footprint import param_sizes
from jaxcap.train.shell.memory_check import check_train_memory, size, train_footprint, update_temporaries
from processes import TINY, cpu_env, launch, load_config, tiny_run


def tiny_run_settings(changes):
  """TINY with `changes` (None drops a setting), as a dict of settings."""
  return {k: v for k, v in {**TINY, **changes}.items() if v is not None}


CFG = M.tiny()
SIZES = dict(param_sizes(CFG))
COUNT = sum(int(np.prod(s)) for s in SIZES.values())


def _config(**changes):
  return schema.parse(load_config("caprl", **changes))  # the typed run config the trainer checks


def test_full_fine_tuning_counts_params_gradients_moments_and_the_reference():
  f = train_footprint(_config(**{"rl.steps": 0}), CFG)  # float32 params
  assert (f.params, f.gradients, f.moments, f.reference, f.rollouts) == (4 * COUNT, 4 * COUNT, 8 * COUNT, 0, 0)
  assert f.total == 16 * COUNT
  with_kl = train_footprint(_config(**{"rl.loss.kl_coef": 0.05}), CFG)
  assert with_kl.reference == 4 * COUNT and with_kl.rollouts > 0
  assert with_kl.total == 16 * COUNT + max(0, with_kl.rollouts - with_kl.gradients) + 4 * COUNT


def test_lora_counts_adapters_as_trainable_and_the_base_as_frozen():
  rank = 4
  f = train_footprint(_config(**{"rl.steps": 0, "model.lora.rank": rank}), CFG)
  targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
  adapted = {
    p: s for p, s in SIZES.items() if p.startswith("layers.") and p.endswith(tuple(f"{t}.kernel" for t in targets))
  }
  assert len(adapted) == len(targets)
  adapters = sum(s[0] * rank * (s[1] + s[2]) for s in adapted.values())  # [L, in, out] -> L x r x (in + out)
  assert (f.params, f.gradients, f.moments) == (4 * COUNT + 4 * adapters, 4 * adapters, 8 * adapters)
  q = train_footprint(_config(**{"rl.steps": 0, "model.lora.rank": rank, "model.lora.weight_qtype": "int8"}), CFG)
  kernels = sum(int(np.prod(s)) for s in adapted.values())
  assert q.params == f.params - 3 * kernels  # int8 kernels: 1 byte instead of 4


def test_sizes_read_in_their_unit():
  assert [size(n) for n in (512, 2048, 3 * 2**20, 1.5 * 2**30)] == ["512 B", "2.00 KiB", "3.00 MiB", "1.50 GiB"]


def test_a_run_that_cannot_fit_is_refused_with_what_would():
  c = _config(**{"rl.loss.kl_coef": 0.05})
  need = train_footprint(c, CFG).total
  check_train_memory(c, CFG, (need, "test"))  # exactly enough: no error
  with pytest.raises(ConfigError) as e:
    check_train_memory(c, CFG, (need - 1, "a test budget"))
  msg = str(e.value)
  assert f"needs at least {size(need)} (" in msg and "a test budget" in msg
  assert "--config.model.lora.rank=16" in msg and "--config.rl.loss.kl_coef=0" in msg
  assert "JAXCAP_MEMORY_BUDGET=off" in msg


@pytest.mark.slow  # the trainer in a subprocess
def test_the_trainer_stops_before_loading_a_checkpoint_that_cannot_fit(tmp_path):
  from hf_reference import save_tiny_checkpoint

  ckpt = tmp_path / "ckpt"
  save_tiny_checkpoint(CFG, 0, ckpt)
  (ckpt / "model.safetensors").write_bytes(b"not read")  # a load would fail on it: the check must come first
  out = launch(
    "caprl",
    *tiny_run({"model.checkpoint": ckpt, "vision_warmup.steps": 0, "vision_warmup.batch_size": None}),
    workdir=tmp_path / "run",
    env=cpu_env(1, JAXCAP_MEMORY_BUDGET="64KiB"),
    check=False,
  )
  assert out.returncode == 2, out.stderr[-2000:]
  assert "needs at least" in out.stderr and "64.00 KiB is available (JAXCAP_MEMORY_BUDGET)" in out.stderr, out.stderr


def _one_device_mesh(config):
  import jax

  from jaxcap.sharding import make_mesh

  return make_mesh(dict(config.mesh.shape), jax.devices()[:1])


def test_the_updates_activations_are_counted_and_grow_with_the_caption_length():
  """XLA's own count of the RL update's temporaries (the program compiled with abstract weights): longer captions,
  more activations, and a footprint that says so."""
  short, long = (_config(**{"sampling.max_new_tokens": n}) for n in (16, 64))
  mesh = _one_device_mesh(short)
  small, large = update_temporaries(short, CFG, mesh), update_temporaries(long, CFG, mesh)
  assert large > 2 * small > 0
  footprint = train_footprint(long, CFG, large)
  assert footprint.total == footprint.params + footprint.moments + footprint.reference + large
  assert footprint.total > train_footprint(long, CFG).total + large // 2
  assert "the RL update's activations and gradients" in footprint.describe()
  assert "up to 64 new tokens a pass, model.remat=none" in footprint.describe()


def test_a_run_whose_update_cannot_fit_is_refused_naming_the_knobs():
  """Room for the weights, moments and rollouts but not the update's activations: refused, in one line, with the
  settings that shrink them; the static part already over the budget is refused without compiling anything."""
  c = _config(**{"sampling.max_new_tokens": 64, "rl.batch_size": 4, "rl.micro_batches": 1})
  mesh = _one_device_mesh(c)
  static = train_footprint(c, CFG).total
  with pytest.raises(ConfigError) as e:
    check_train_memory(c, CFG, (static + 2**20, "a test budget"), mesh=mesh)
  msg = str(e.value)
  assert "\n" not in msg and "the RL update's activations and gradients" in msg and "a test budget" in msg
  assert "--config.model.remat=full" in msg and "--config.rl.micro_batches=2" in msg
  assert "--config.sampling.max_new_tokens (now 64" in msg
  update = update_temporaries(c, CFG, mesh)
  check_train_memory(c, CFG, (train_footprint(c, CFG, update).total, "test"), mesh=mesh)  # exactly enough
  import jaxcap.train.shell.memory_check as memory_check

  def no_compile(*args):
    raise AssertionError("compiled the update for a run whose state alone does not fit")

  original, memory_check.update_temporaries = memory_check.update_temporaries, no_compile
  try:
    with pytest.raises(ConfigError, match="needs at least"):
      check_train_memory(c, CFG, (static - 1, "test"), mesh=mesh)
  finally:
    memory_check.update_temporaries = original


@pytest.mark.slow  # the trainer in a subprocess
def test_the_trainer_refuses_an_update_that_cannot_fit_before_loading(tmp_path):
  """The issue-56 case in small: 64 new tokens, the memory for everything but the update's activations; the
  trainer stops before its checkpoint is read (a load would fail on the weights file), exit 2, one line."""
  from hf_reference import save_tiny_checkpoint

  ckpt = tmp_path / "ckpt"
  save_tiny_checkpoint(CFG, 0, ckpt)
  (ckpt / "model.safetensors").write_bytes(b"not read")
  run = {"model.checkpoint": str(ckpt), "vision_warmup.steps": 0, "vision_warmup.batch_size": None}
  run |= {"sampling.max_new_tokens": 64}
  from jaxcap.checkpoint import read_config

  c = _config(**{k: v for k, v in tiny_run_settings(run).items() if k.startswith(("rl.", "sampling.", "model."))})
  static = train_footprint(c, read_config(ckpt, **c.model.compute())).total
  out = launch(
    "caprl",
    *tiny_run(run),
    workdir=tmp_path / "run",
    env=cpu_env(1, JAXCAP_MEMORY_BUDGET=str(static + 2**20)),
    check=False,
  )
  assert out.returncode == 2, out.stderr[-2000:]
  errors = [line for line in out.stderr.splitlines() if "needs at least" in line]
  assert len(errors) == 1 and "the RL update's activations and gradients" in errors[0], out.stderr[-2000:]
  assert "--config.sampling.max_new_tokens (now 64" in errors[0]


def test_lora_advice_names_the_frozen_bases_dtype_then_quantization():
  from jaxcap.train.steps.adapters import lora_advice

  f32 = lora_advice(_config(**{"model.lora.rank": 8, "model.param_dtype": "float32"}))
  assert "--config.model.param_dtype=bfloat16" in f32 and "weight_qtype=int8" in f32
  assert f32.index("param_dtype") < f32.index("weight_qtype")  # the cheaper change first
  bf16 = lora_advice(_config(**{"model.lora.rank": 8, "model.param_dtype": "bfloat16"}))
  assert "param_dtype" not in bf16 and "weight_qtype=int8" in bf16
  done = lora_advice(
    _config(**{"model.lora.rank": 8, "model.param_dtype": "bfloat16", "model.lora.weight_qtype": "int8"})
  )
  assert done == ""


def test_generation_past_the_models_context_is_refused_before_any_compute():
  from jaxcap.train.shell.setup import check_context

  cfg = M.tiny()
  check_context(_config(**{"sampling.max_new_tokens": 64}), cfg)
  context = cfg.text.max_position_embeddings
  with pytest.raises(
    ConfigError, match=rf"sampling.max_new_tokens=100000000 does not fit the model's context of {context}"
  ):
    check_context(_config(**{"sampling.max_new_tokens": 100_000_000}), cfg)
  with pytest.raises(ConfigError, match=r"sft.max_target_tokens=.* set sft.max_target_tokens below"):
    check_context(_config(**{"sft.max_target_tokens": context}), cfg)
