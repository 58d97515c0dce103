"""`jaxcap.plan` compiles a run's programs ahead of time on a target topology and judges whether they fit."""

import jax
import pytest

from jaxcap.models.qwen25vl_presets import tiny
from jaxcap.plan import GIB, format_plan, plan
from jaxcap.config.schema import parse
from jaxcap.config_files import base_config
from processes import cli


def _config():
  c = base_config()
  c.model.update(dict(dtype="bfloat16", param_dtype="float32", remat="full"))
  c.rl.update(dict(batch_size=4, num_samples=2, micro_batches=2))
  c.rl.loss.kl_coef = 0.05  # with a reference copy in the state
  c.sampling.max_new_tokens = 16
  c.data.image_size = 56
  return c


@pytest.fixture(scope="module")
def planned():
  cfg = tiny(dtype=jax.numpy.bfloat16, remat="full")
  return plan(parse(_config()), cfg, jax.devices()[:8], hbm_gib=80.0, text=8)


@pytest.mark.slow
def test_every_program_compiles_and_reports_memory(planned):
  assert [p["name"] for p in planned["programs"]] == ["rl_step", "logprobs", "prefill", "decode"]
  assert planned["mesh"] == {"data": 1, "fsdp": 8, "tensor": 1} and planned["devices"] == 8
  assert planned["batch"] == {"prompts": 4, "samples": 2, "micro_batches": 2, "prompt_tokens": 16, "completion": 16}
  for p in planned["programs"]:
    assert p["arguments"] > 0 and p["compile_s"] > 0 and p["peak"] >= p["arguments"]
  step = planned["programs"][0]
  assert planned["update_model_tflop"] > 0
  # each prompt once per group (model.share_prompt): 4 x 16 + 8 x 16 = 192 decoder slots, not 8 x (16 + 16) = 256
  d = planned["update_decoder_tflop"]
  assert planned["prompt_shared"] and 1.2 < d["prompt_repeated"] / d["as_run"] < 1.34, (
    d
  )  # the LM head is shared by neither
  assert "decoder FLOPs per RL update" in format_plan(planned)
  # the update step takes (and donates) the whole train state: params, 2 Adam moments, the reference copy
  assert step["arguments"] >= 3.5 * planned["params_gib_per_device"] * GIB
  assert step["aliased"] > 0
  others = {p["name"]: p["resident_outside"] for p in planned["programs"][1:]}
  assert set(others.values()) == {(planned["train_state_gib_per_device"] - planned["params_gib_per_device"]) * GIB}
  assert planned["fits"] and planned["advice"] == []
  assert planned["peak_gib"] == max(p["peak"] for p in planned["programs"]) / GIB


@pytest.mark.slow
def test_state_is_sharded_not_replicated(planned):
  one_device = plan(parse(_config()), tiny(dtype=jax.numpy.bfloat16), jax.devices()[:1], 80.0, ("decode",), text=8)
  # fsdp 8 holds roughly an eighth of the state per device (small vectors stay replicated)
  assert planned["train_state_gib_per_device"] < one_device["train_state_gib_per_device"] / 4


@pytest.mark.slow
def test_a_plan_over_budget_says_what_to_change(planned):
  budget = planned["peak_gib"] / 2
  res = plan(parse(_config()), tiny(dtype=jax.numpy.bfloat16, remat="full"), jax.devices()[:8], budget, ("rl_step",), 8)
  assert not res["fits"] and res["advice"]
  assert "rl_step is" in res["advice"][0] and "GiB over" in res["advice"][0]
  text = format_plan(res)
  assert "does NOT fit" in text and "rl_step" in text


@pytest.mark.slow  # the plan CLI in a subprocess
def test_cli_prints_a_verdict(tmp_path):
  out = cli(
    "plan",
    "--config=configs/caprl.py:paper",
    "--model=tiny",
    "--topology=cpu:4",
    "--programs=decode",
    "--config.sampling.max_new_tokens=8",
    "--config.data.image_size=56",
    f"--json={tmp_path / 'plan.json'}",
  )
  assert "fits" in out.stdout and "decode" in out.stdout and "fsdp': 4" in out.stdout
  assert (tmp_path / "plan.json").exists()


@pytest.mark.slow  # the plan CLI in a subprocess
def test_cli_needs_a_model_for_the_embedded_student():
  out = cli("plan", "--config=configs/caprl.py", timeout=300, check=False)
  assert out.returncode != 0 and "pass --model=qwen2.5-vl-3b" in out.stderr


@pytest.mark.slow
def test_packed_micro_batches_are_planned_at_the_budget():
  """With rl.micro_batch_tokens the plan compiles the packed programs on micro-batches of the budget, each as full as
  the budget lets it be: a smaller budget, more of them. (The tiny model's temporaries are dominated by its
  parameter-sized buffers, so they are not compared here.)"""
  cfg = tiny(dtype=jax.numpy.bfloat16, remat="full")
  counts = {}
  for budget in (64, 256):
    c = _config()
    c.rl.update(dict(micro_batches=1, micro_batch_tokens=budget))
    result = plan(parse(c), cfg, jax.devices()[:1], hbm_gib=80.0, names=("rl_step", "logprobs"), text=8)
    assert [p["name"] for p in result["programs"]] == ["rl_step", "logprobs"]
    micro = result["batch"]["micro_batches"]
    assert micro.endswith("packed") and all(p["temporaries"] > 0 for p in result["programs"]), result
    counts[budget] = int(micro.split()[0])
  assert counts[64] > counts[256] >= 1, counts


def test_presets_of_either_family_and_tiny_by_the_configs_family():
  """`--model` takes every family's presets; tiny / mid (in both families) follow `model.family`."""
  from jaxcap.models.qwen3vl_config import Qwen3VLConfig
  from jaxcap.plan import model_config

  config = _config()
  assert type(model_config(parse(config), "tiny")).__name__ == "Qwen25VLConfig"
  assert isinstance(model_config(parse(config), "qwen3-vl-4b"), Qwen3VLConfig)
  config.model.family = "qwen3_vl"
  assert isinstance(model_config(parse(config), "tiny"), Qwen3VLConfig)
  with pytest.raises(SystemExit, match="qwen3-vl-8b"):
    model_config(parse(config), "qwen9")


@pytest.mark.slow
def test_the_paged_engine_is_planned_with_its_pool():
  c = _config()
  c.mesh.shape.fsdp = 1
  c.rollout.update(dict(engine="paged", slots=4, page_size=8))
  cfg = tiny(dtype=jax.numpy.bfloat16, remat="full")
  res = plan(parse(c), cfg, jax.devices()[:1], 80.0, ("prefill", "decode"), text=8)
  assert [p["name"] for p in res["programs"]] == ["paged_prefill", "segment"]
  assert all(p["arguments"] > 0 and p["bytes_accessed"] > 0 for p in res["programs"])
  # prompts of up to 16 tokens = 2 pages of 8, at worst 15 (the second page partly filled: 7 tokens, copied by each
  # sample); a sample's own pages: ceil((7 + 16 - 1) / 8) = 3, it reads 1 + 3; 4 prompts in the step
  e = res["engine"]
  assert (e["slots"], e["page_size"], e["read_pages"]) == (4, 8, 4)
  assert e["attention"] == "blocked"  # a CPU target: blocked jnp attention (rollout.attention=auto)
  assert e["pages"] == 1 + 4 * (2 + 3) + 4 * 2  # the null page, every slot at its worst, one step's prompts
  t = cfg.text
  assert e["pool_bytes"] == 2 * t.num_hidden_layers * t.num_key_value_heads * e["pages"] * 8 * t.head_dim * 2
  assert "paged engine: 4 slots, a pool of 29 pages x 8 tokens" in format_plan(res)
  # data parallel on 2 devices: one engine per device's 2 prompts, each with the whole model
  c.mesh.shape.fsdp = 2
  two = plan(parse(c), cfg, jax.devices()[:2], 80.0, ("prefill", "decode"), text=8)
  assert two["engine"]["shards"] == 2 and two["engine"]["pages"] == 1 + 4 * (2 + 3) + 2 * 2
  segment = lambda r: next(p for p in r["programs"] if p["name"] == "segment")["arguments"]
  pool = lambda r: r["engine"]["pool_bytes"]
  # the whole model on each device as on one; a smaller pool, and the outputs of its 2 prompts only
  assert segment(res) - segment(two) > pool(res) - pool(two) == 4 * pool(res) // res["engine"]["pages"]
  assert "2 engines, one per device's block of prompts" in format_plan(two)


@pytest.mark.slow
def test_the_slots_that_fit_are_the_most_that_fit():
  """The plan's slot count for a budget, from the engine's programs compiled at 4 and 8 slots, fits it exactly:
  one slot more does not."""
  c = _config()
  c.mesh.shape.fsdp = 1
  c.rollout.update(dict(engine="paged", slots=4, page_size=8))
  cfg = tiny(dtype=jax.numpy.bfloat16, remat="full")
  budget = plan(parse(c), cfg, jax.devices()[:1], 80.0, ("prefill", "decode"), text=8)["peak_gib"] + 2**17 / GIB
  res = plan(parse(c), cfg, jax.devices()[:1], budget, ("prefill", "decode"), text=8)
  n = res["engine"]["slots_fit"]
  assert n > 4 and f"about {n}" in format_plan(res)
  for slots, fits in ((n, True), (n + 1, False)):
    c.rollout.slots = slots
    assert plan(parse(c), cfg, jax.devices()[:1], budget, ("prefill", "decode"), text=8)["fits"] is fits, slots


def test_an_engine_program_over_budget_names_the_engines_settings():
  """The engine's programs hold the whole model and the page pool: more micro-batches would not help them."""
  from types import SimpleNamespace

  from jaxcap.plan.report import advice

  c = _config()
  c.rollout.update(dict(engine="paged", slots=8))
  over = SimpleNamespace(name="segment", peak=3 * GIB, temporaries=GIB, arguments=2 * GIB)
  [line] = advice(c, [over], 0, 2 * GIB, mesh=None)
  assert line.startswith("segment is 1.0 GiB over") and "rollout.slots (now 8)" in line
  assert "micro_batches" not in line and "bfloat16" in line
  [line] = advice(c, [over], 0, 2 * GIB, mesh=None, slots_fit=0)  # not even the model and one slot's pages
  assert "no slot count fits" in line and "rollout.engine='static'" in line


def test_an_update_over_budget_offers_remat_only_where_it_is_not_full():
  from types import SimpleNamespace

  from jaxcap.plan.report import advice

  c = _config()
  over = SimpleNamespace(name="rl_step", peak=3 * GIB, temporaries=2 * GIB, arguments=GIB)
  c.model.remat = "dots"
  [line] = advice(c, [over], 0, 2 * GIB, mesh=None)
  assert "set model.remat='full' (now 'dots')" in line and "rl.micro_batches" in line
  c.model.remat = "full"
  [line] = advice(c, [over], 0, 2 * GIB, mesh=None)
  assert "remat" not in line and "rl.micro_batches" in line


@pytest.mark.slow
def test_async_counts_the_queued_rounds_in_the_passes_they_outlive():
  cfg = tiny(dtype=jax.numpy.bfloat16, remat="full")
  on, two = _config(), _config()
  on.rl.max_staleness, two.rl.max_staleness = 1, 2
  off_res, on_res, two_res = (
    plan(parse(c), cfg, jax.devices()[:8], 80.0, ("logprobs",), text=8) for c in (_config(), on, two)
  )
  assert off_res["queued_round_gib"] == 0 and on_res["queued_round_gib"] > 0
  assert two_res["queued_round_gib"] == 2 * on_res["queued_round_gib"]  # k rounds queued colocated
  # the log-prob pass holds the queued round besides the state it does not take: exactly that round's bytes more
  extra = on_res["programs"][0]["resident_outside"] - off_res["programs"][0]["resident_outside"]
  assert extra == on_res["queued_round_gib"] * GIB
  assert "the queued rounds' prompts and rollouts" in format_plan(on_res)


def test_a_program_the_compiler_refuses_for_memory_is_reported_not_raised():
  """The TPU compiler refuses a program whose temporaries exceed the chip's HBM: `plan` records it as not fitting."""
  from jaxcap.plan.compile import compile_or_refusal

  class Refused:
    def __init__(self, message):
      self.message = message

    def compile(self):
      raise jax.errors.JaxRuntimeError(self.message)

  oom = "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries (17.12G) exceeds"
  compiled, error, temporaries = compile_or_refusal(Refused(oom + " available HBM (15.75G).\nmore"))
  assert compiled is None and error.startswith("RESOURCE_EXHAUSTED") and "\n" not in error
  assert temporaries == int(17.12 * 2**30)
  with pytest.raises(jax.errors.JaxRuntimeError, match="INVALID_ARGUMENT"):  # other failures still raise
    compile_or_refusal(Refused("INVALID_ARGUMENT: bad"))


@pytest.mark.slow
@pytest.mark.parametrize("rank", [0, 4], ids=["full", "lora"])
def test_a_disaggregated_plan_runs_the_rollouts_on_their_devices_with_the_whole_model(rank):
  """rollout.devices=4 of 8: the learner's programs on a 4-device mesh, the sampler's on the other 4 with the
  whole model in the compute dtype on each, beside room for the next version (all of it, or LoRA's adapters)."""
  cfg = tiny(dtype=jax.numpy.bfloat16, remat="full")
  c = _config()
  c.rl.max_staleness, c.rollout.devices, c.model.lora.rank = 2, 4, rank
  split = plan(parse(c), cfg, jax.devices()[:8], 80.0, ("logprobs", "prefill"), text=8)
  assert split["layout"] == {
    "learner": {"devices": 4, "mesh": {"data": 1, "fsdp": 4, "tensor": 1}},
    "rollouts": {"devices": 4, "mesh": {"data": 4, "fsdp": 1, "tensor": 1}},
  }
  _, prefill = split["programs"]
  params = split["model"]["params"]  # float32 masters: the rollouts read them in bfloat16, whole
  assert prefill["arguments"] >= 2 * params
  moved = split["weight_sync_gib"] * GIB
  assert prefill["resident_outside"] == moved
  if rank:
    assert 0 < moved < 0.1 * 2 * params  # the adapters only
  else:
    assert moved == 2 * params
  assert "disaggregated: learner on 4 devices" in format_plan(split)
  c.rollout.devices, c.rl.max_staleness = 0, 0
  colocated = plan(parse(c), cfg, jax.devices()[:8], 80.0, ("prefill",), text=8)
  assert colocated["weight_sync_gib"] == 0 and colocated["layout"]["rollouts"] == "colocated"
  assert colocated["programs"][0]["arguments"] < prefill["arguments"]  # the params' float32 shard of 8 devices


def test_a_tpu_topology_splits_into_two_slices_for_the_rollouts():
  """Where the TPU compiler is importable (libtpu): rollout.devices=2 of a v5e 4x4's four hosts of four chips is
  two 2x4 slices, one each; a count that is no slice is refused."""
  pytest.importorskip("libtpu")
  from jaxcap.plan.topology import split_slices

  learner, rollouts = split_slices("tpu:v5e:4x4", 2)
  assert len(learner) == len(rollouts) == 8 and all(d.platform == "tpu" for d in learner + rollouts)
  with pytest.raises(SystemExit, match="12 chips are no slice"):  # 4 chips roll out, 12 are left
    split_slices("tpu:v5e:4x4", 1)
