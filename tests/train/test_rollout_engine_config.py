"""The `rollout` block: rollout.engine chooses the RL trainer's sampler; bad values fail before compute, named."""

import json

import numpy as np
import pytest

from jaxcap.choices import ROLLOUT_ENGINES
from jaxcap.config import schema
from jaxcap.config.sampling import Rollout
from jaxcap.sampling.engine import EngineConfig
from jaxcap.config_files import base_config
from jaxcap.train.steps.programs import rollout_engine
from processes import cpu_env, launch, tiny_run


def test_static_is_the_default_and_paged_builds_the_engine():
  c = base_config()
  assert c.rollout.engine == "static" and rollout_engine(schema.validate(c)) is None
  c.rollout.update(dict(engine="paged", slots=8, page_size=4, segment_steps=5, pages=100, attention="reference"))
  got = rollout_engine(schema.validate(c))
  assert got == EngineConfig(slots=8, page_size=4, segment_steps=5, pages=100, attention="reference")
  declared = {f.name: f for f in Rollout.__dataclass_fields__.values()}
  assert declared["engine"].metadata["choices"] is ROLLOUT_ENGINES


@pytest.mark.parametrize(
  "key,value,message",
  [
    ("engine", "vllm", "rollout.engine='vllm': use static or paged"),
    ("slots", 0, "rollout.slots=0: must be >= 1"),
    ("page_size", 0, "rollout.page_size=0: must be >= 1"),
    ("pages", -1, "rollout.pages=-1: must be >= 0"),
    ("attention", "flash", "rollout.attention='flash': use auto, reference or pallas"),
  ],
)
def test_bad_rollout_values_are_named(key, value, message):
  c = base_config()
  c.rollout[key] = value
  with pytest.raises(ValueError) as err:
    schema.validate(c)
  assert message in str(err.value)


def test_paged_engine_is_accepted_for_multi_host_runs():
  """Each process's devices run the engine over its own prompts (jaxcap.sampling.mesh_shards): a multi-host run
  validates and builds the same engine as a single-process one."""
  c = base_config()
  c.rollout.engine = "paged"
  c.distributed.update(dict(coordinator_address="host:1234", num_processes=2, process_id=0))
  run = schema.validate(c)
  assert run.distributed.num_processes == 2 and rollout_engine(run) == EngineConfig()


@pytest.mark.slow
def test_rl_run_with_the_paged_engine_and_packed_micro_batches(tmp_path):
  """A whole run (SFT, RL, held-out evaluation) with rollout.engine=paged and fewer slots than samples, on a
  2-device mesh (the batch over fsdp: each device's engine decodes its prompts' samples and the update consumes the
  global arrays); also the run of a non-default policy loss from the command line (GSPO, `rl.loss.policy=gspo`),
  and of packed micro-batches (`rl.micro_batch_tokens`, `sft.micro_batch_tokens`: SFT's step and RL's log-prob
  passes and update are the packed programs, and every step logs its packing). In float32 the engine's log-probs
  are the packed pass's up to rounding: the mismatch metrics are ~0. Each step logs its XLA compiles
  (time/compiles): the second RL step compiles fewer than the first (at most the engine's buckets the first did not
  visit); the update programs are compiled once over the run."""
  import collections

  from processes import compiles

  engine = {"rollout.engine": "paged", "rollout.slots": 3, "rollout.page_size": 8}
  # every step packed: at the tiny run's lengths packing saves less than the default packing_min_saving
  packed = {"rl.micro_batch_tokens": 256, "sft.micro_batch_tokens": 256}
  packed |= {"rl.packing_min_saving": -1, "sft.packing_min_saving": -1}
  env = cpu_env(2, JAX_LOG_COMPILES="1")
  out = launch("caprl", *tiny_run({**engine, **packed, "rl.loss.policy": "gspo"}), workdir=tmp_path, env=env)
  assert json.loads((tmp_path / "config.json").read_text())["config"]["rl"]["loss"]["policy"] == "gspo"
  by_name = collections.Counter(name for name, _ in compiles(out.stderr))
  assert by_name["packed_rl_step"] == 1 and by_name["packed_sequence_logprobs"] == 1, by_name
  assert by_name["packed_sft_step"] == 1, by_name
  assert by_name["rl_step"] == by_name["sequence_logprobs"] == by_name["sft_step"] == 0, by_name
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  sft = [r for r in rows if r.get("phase") == "sft" and "loss" in r]
  assert len(sft) == 2 and all(0 <= r["packing/padding_share"] < 0.5 and np.isfinite(r["loss"]) for r in sft)
  assert all(r["packing/packed"] == 1 for r in sft)
  rl = [r for r in rows if "length/mean" in r]
  assert len(rl) == 2 and all(0 < r["length/mean"] <= 8 and np.isfinite(r["loss"]) for r in rl)
  assert rl[0]["time/compiles"] > rl[1]["time/compiles"] >= 0
  for r in rl:
    assert 0 <= r["packing/padding_share"] < 0.5 and r["packing/micro_batches"] >= 1 and r["packing/packed"] == 1
    assert np.isfinite(r["grad_norm"])
    assert abs(r["rollout_corr/kl_k1"]) < 1e-5 and abs(r["rollout_corr/log_ppl_abs_diff"]) < 1e-4, r
    assert r["rollout_corr/training_log_ppl"] == pytest.approx(r["rollout_corr/rollout_log_ppl"], abs=1e-4)
