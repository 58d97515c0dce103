"""The trainer's memory check (jaxcap.train.shell.memory_check): the footprint's parts counted by hand on the tiny model,
and a run that cannot fit refused before its checkpoint is read, with the numbers and settings that would fit."""

import json
import re

import jax.numpy as jnp
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
  auto = lora_advice(_config(**{"model.lora.rank": 8}), base_dtype="float32")  # 'auto' on a float32 checkpoint
  assert "it is float32 now, the checkpoint's stored dtype (model.param_dtype='auto')" in auto
  assert "param_dtype" not in lora_advice(_config(**{"model.lora.rank": 8}), base_dtype="bfloat16")


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


def _checkpoint_dir(path, **config):
  path.mkdir()
  (path / "config.json").write_text(json.dumps(config))
  return str(path)


def test_a_lora_base_defaults_to_the_checkpoints_dtype(tmp_path):
  """Issue 57: a LoRA run's frozen base was held in float32 whatever the checkpoint stored (90.4 GiB against 59.5 for
  Qwen2.5-VL-7B). model.param_dtype='auto' (the default) holds it in the checkpoint's dtype; full fine-tuning and
  the embedded student keep float32 masters; a value the user sets wins."""
  bf16 = _checkpoint_dir(tmp_path / "bf16", dtype="bfloat16", text_config={"dtype": "bfloat16"})
  fp16 = _checkpoint_dir(tmp_path / "fp16", torch_dtype="float16")  # held in float32, which keeps it exactly
  unstated = _checkpoint_dir(tmp_path / "unstated")
  held = lambda **c: _config(**c).model.param_dtype_name()
  assert _config().model.param_dtype == "auto"
  assert held(**{"model.lora.rank": 8, "model.checkpoint": bf16}) == "bfloat16"
  assert held(**{"model.lora.rank": 8, "model.checkpoint": fp16}) == "float32"
  assert held(**{"model.lora.rank": 8, "model.checkpoint": unstated}) == "float32"
  assert held(**{"model.checkpoint": bf16}) == "float32"  # full fine-tuning: float32 masters
  assert held(**{"model.lora.rank": 8}) == "float32"  # the embedded student: its SFT trains the base
  assert held(**{"model.lora.rank": 8, "model.checkpoint": bf16, "model.param_dtype": "float32"}) == "float32"
  lora = _config(**{"model.lora.rank": 8, "model.checkpoint": bf16}).model
  assert lora.compute()["param_dtype"] == jnp.bfloat16


def test_the_trainer_loads_a_lora_base_in_the_checkpoints_dtype(tmp_path, monkeypatch):
  """The trainer's load (`setup._student`) reads and loads the checkpoint under the same rule (stubbed: no weights)."""
  from jaxcap.train.shell import setup

  bf16 = _checkpoint_dir(tmp_path / "bf16", dtype="bfloat16")
  seen = {}

  class Loaded(Exception):
    pass

  def load(directory, **kw):
    seen["load"] = kw["param_dtype"]
    raise Loaded

  monkeypatch.setattr(setup, "read_config", lambda d, **kw: seen.setdefault("read", kw["param_dtype"]) and CFG)
  for name in ("check_context", "check_train_memory", "checkpoint_processor"):
    monkeypatch.setattr(setup, name, lambda *a, **k: None)
  monkeypatch.setattr(setup, "load_hf_checkpoint", load)
  for rank, want in ((8, jnp.bfloat16), (0, jnp.float32)):
    seen.clear()
    with pytest.raises(Loaded):
      setup._student(_config(**{"model.lora.rank": rank, "model.checkpoint": bf16}), tmp_path, None)
    assert seen == {"read": want, "load": want}


def test_the_plan_holds_a_lora_base_as_the_run_does():
  """`jaxcap.plan --model=<preset>`: a released model's preset is stored in bfloat16, as its checkpoints."""
  from jaxcap.plan.topology import model_config

  lora = _config(**{"model.lora.rank": 16})
  assert model_config(lora, "qwen2.5-vl-7b").param_dtype == jnp.bfloat16
  assert model_config(lora, "tiny").param_dtype == jnp.float32  # no released checkpoint
  assert model_config(_config(), "qwen2.5-vl-7b").param_dtype == jnp.float32  # full fine-tuning
  f32 = _config(**{"model.lora.rank": 16, "model.param_dtype": "float32"})
  assert model_config(f32, "qwen2.5-vl-7b").param_dtype == jnp.float32


def test_a_saved_float32_default_resumes_under_auto(tmp_path):
  """A run saved with model.param_dtype='float32' (the default before 'auto') resumes with nothing to confirm where
  'auto' holds the params in float32 too; where it would not (a LoRA base stored in bfloat16), the change is listed."""
  from jaxcap.train.shell import resume

  bf16 = _checkpoint_dir(tmp_path / "bf16", dtype="bfloat16")
  position = resume.Position("rl", 2, 1602)
  for changes, listed in (({}, False), ({"model.lora.rank": 8, "model.checkpoint": bf16}, True)):
    workdir = tmp_path / f"run{len(changes)}"
    workdir.mkdir()
    resume.record(_config(**changes, **{"model.param_dtype": "float32"}), workdir, [])
    if listed:
      with pytest.raises(resume.ConfigChangedError, match="model.param_dtype: 'float32' -> 'auto'"):
        resume.check(_config(**changes), workdir, position)
    else:
      assert resume.check(_config(**changes), workdir, position) == []


PAGED = {"rollout.engine": "paged", "sft.steps": 0}


def test_a_page_pool_larger_than_the_device_is_refused_naming_the_knob():
  """Issue 57: lengths within the model's context but a pool larger than the device (long captions times many slots,
  or a large rollout.pages) died on the pool's allocation after SFT. Now one line, before any compute."""
  from jaxcap.train.shell.pool_memory import check_pool_memory, page_pool

  long = _config(**PAGED, **{"sampling.max_new_tokens": 4000, "rollout.slots": 256})  # tiny: 4096 positions
  pages, page, worst = page_pool(long, CFG)
  assert (
    pages == 1 + 256 * worst
    and page == 2 * CFG.text.num_hidden_layers * CFG.text.num_key_value_heads * 16 * CFG.text.head_dim * 4
  )
  budget = pages * page // 4
  with pytest.raises(ConfigError) as e:
    check_pool_memory(long, CFG, available=(budget, "test budget"))
  message = str(e.value)
  assert "\n" not in message and message.startswith("the paged engine's page pool needs at least ")
  assert (
    f"({pages} pages of 16 tokens: rollout.slots=256 x {worst} pages for a prompt and sampling.max_new_tokens=4000)"
    in message
  )
  assert "but a device holds " in message and "(test budget); lower rollout.slots (now 256; " in message
  assert "or sampling.max_new_tokens (now 4000), or use rollout.engine='static'" in message
  fit = int(re.search(r"now 256; (\d+) fit", message)[1])
  check_pool_memory(_config(**PAGED, **{"sampling.max_new_tokens": 4000, "rollout.slots": fit}), CFG, (budget, "test"))
  huge = _config(**PAGED, **{"rollout.pages": 10**9})
  with pytest.raises(
    ConfigError, match=r"1000000000 pages of 16 tokens\) .* lower rollout.pages \(now 1000000000; about \d+ fit\)"
  ):
    check_pool_memory(huge, CFG, available=(budget, "test budget"))
  check_pool_memory(_config(**{"sampling.max_new_tokens": 4000, "rollout.slots": 256}), CFG, (1, "test"))  # static
  check_pool_memory(_config(**PAGED, **{"rl.steps": 0, "rollout.pages": 10**9}), CFG, (1, "test"))  # no RL


def test_the_page_pool_check_counts_a_hybrid_decoders_linear_states():
  """Qwen3.5: the pool's pages hold its attention layers only (2 of the tiny preset's 6), and its linear states
  (each slot's, and a store row per prompt in flight) count beside them; the slots the refusal names fit."""
  from jaxcap.models.qwen35_presets import qwen35_tiny
  from jaxcap.train.shell.pool_memory import check_pool_memory, page_pool

  cfg = qwen35_tiny()
  t = cfg.text
  run = lambda slots: _config(**PAGED, **{"rollout.slots": slots})
  pages, page, worst = page_pool(run(64), cfg)
  assert page == 2 * t.kv_layers * t.num_key_value_heads * 16 * t.head_dim * 4 and t.kv_layers == 2
  model = sum(int(np.prod(s)) for _, s in param_sizes(cfg)) * 4
  budget = model + pages * page + (2 * 64 + 1) * t.recurrent_bytes(cfg.dtype)
  check_pool_memory(run(64), cfg, (budget, "test"))
  with pytest.raises(ConfigError, match=r"of linear states, .* per slot and per prompt in flight\) beside") as e:
    check_pool_memory(run(64), cfg, (budget - 1, "test"))
  fit = int(re.search(r"now 64; (\d+) fit", str(e.value))[1])
  assert 0 < fit < 64
  check_pool_memory(run(fit), cfg, (budget - 1, "test"))


def test_the_device_figure_is_the_accelerators_own_or_the_hosts(monkeypatch):
  from jaxcap.train.shell.pool_memory import device_memory

  class Gpu:
    platform, device_kind = "gpu", "NVIDIA H100 80GB HBM3"

    def memory_stats(self):
      return {"bytes_limit": 80 * 2**30, "bytes_in_use": 0}

  monkeypatch.delenv("JAXCAP_MEMORY_BUDGET", raising=False)
  assert device_memory(Gpu()) == (80 * 2**30, "NVIDIA H100 80GB HBM3's memory_stats() bytes_limit")
  monkeypatch.setattr(Gpu, "memory_stats", lambda self: None)  # a backend that keeps none: no check
  assert device_memory(Gpu()) is None
  monkeypatch.setenv("JAXCAP_MEMORY_BUDGET", "2GiB")
  assert device_memory(Gpu()) == (2 * 2**30, "JAXCAP_MEMORY_BUDGET")
  assert device_memory() == (2 * 2**30, "JAXCAP_MEMORY_BUDGET")  # this host's CPU device
  monkeypatch.setenv("JAXCAP_MEMORY_BUDGET", "off")
  assert device_memory() is None


def test_the_trainer_checks_the_pool_before_loading(tmp_path, monkeypatch):
  """The trainer's setup refuses the pool before the checkpoint is read (stubbed: no weights)."""
  from jaxcap.train.shell import setup

  ckpt = _checkpoint_dir(tmp_path / "ckpt", dtype="float32")
  monkeypatch.setattr(setup, "read_config", lambda d, **kw: CFG)
  monkeypatch.setattr(setup, "load_hf_checkpoint", lambda *a, **k: pytest.fail("loaded before the pool check"))
  monkeypatch.setattr(setup, "check_train_memory", lambda *a, **k: None)
  monkeypatch.setenv("JAXCAP_MEMORY_BUDGET", "64MiB")
  config = _config(**PAGED, **{"model.checkpoint": ckpt, "rollout.pages": 10**6})
  with pytest.raises(ConfigError, match=r"lower rollout.pages \(now 1000000\b"):
    setup._student(config, tmp_path, None)


def test_the_lora_fix_is_counted_at_the_dtype_auto_gives(tmp_path):
  """Full fine-tuning of a bfloat16 checkpoint that does not fit: `--config.model.lora.rank=16` alone already holds
  the base in bfloat16 ('auto'), counted so; with a float32 checkpoint the bfloat16 base is offered as well."""
  for stored, offered in (("bfloat16", False), ("float32", True)):
    ckpt = _checkpoint_dir(tmp_path / stored, dtype=stored)
    c = _config(**{"model.checkpoint": ckpt})
    lora_bf16 = train_footprint(
      _config(**{"model.checkpoint": ckpt, "model.lora.rank": 16}), CFG.replace(param_dtype=jnp.bfloat16)
    )
    with pytest.raises(ConfigError) as e:
      check_train_memory(c, CFG, (train_footprint(c, CFG).total - 1, "test"))
    msg = str(e.value)
    assert ("--config.model.lora.rank=16 --config.model.param_dtype=bfloat16" in msg) == offered, msg
    if not offered:
      assert f"--config.model.lora.rank=16 ({size(lora_bf16.total)})" in msg, msg
