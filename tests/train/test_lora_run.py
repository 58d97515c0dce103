"""The main job with LoRA on a checkpoint's base (`model.lora`): its checkpoints hold the adapters only, a resume
from one continues exactly, the KL reference is the base with the adapters off, and the export is the merged
model with the frozen weights untouched."""

import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file

from processes import TINY, launch, tiny_run

pytestmark = pytest.mark.slow  # launches training runs in subprocesses

# From the base's export: 2 SFT and 3 RL steps, a checkpoint after each, KL to the base, the merged export
LORA = {
  **TINY,
  "vision_warmup.steps": 0,
  "vision_warmup.batch_size": None,
  "model.student.text_layers": None,
  "model.student.vision_depth": None,
  "rl.steps": 3,
  "checkpoint.every": 1,
  "export.hf": True,
  "export.peft": True,
  "model.lora.rank": 4,
  "rl.loss.kl_coef": 0.05,
  # 2 SFT steps move the adapters off the base (the tiny run's rewards are flat, so RL alone barely moves them)
  "sft.steps": 2,
  "sft.optim.warmup_steps": 0,
}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
  """An HF checkpoint of the tiny embedded student after its SFT (the LoRA runs' frozen base)."""
  workdir = tmp_path_factory.mktemp("base")
  launch("caprl", *tiny_run({"export.hf": True, "rl.steps": 0}), workdir=workdir)
  return workdir / "export"


def _rows(workdir):
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def test_lora_run_saves_adapters_resumes_exactly_and_exports_merged(base, tmp_path):
  workdir = tmp_path / "run"
  args = tiny_run({"model.checkpoint": base}, base=LORA)
  launch("caprl", *args, workdir=workdir)
  first = _rows(workdir)
  last = workdir / "checkpoints" / "5"  # global steps: SFT 1-2, RL 3-5
  tree = json.loads((last / "state" / "_METADATA").read_text())["tree_metadata"]
  params = [k for k in tree if k.startswith("('params'")]
  assert params and all("_lora_" in k for k in params), params[:4]  # no base weight in a checkpoint
  assert not any(k.startswith("('ref_params', ") for k in tree)  # no reference copy (None): the base is the reference
  kl = [r["kl"] for r in first if "kl" in r]
  assert len(kl) == 3 and all(np.isfinite(kl)) and min(kl) > 0  # SFT's adapters moved the policy off its base

  shutil.rmtree(last)  # as if killed after RL step 2's checkpoint: the rerun resumes there
  out = launch("caprl", *args, workdir=workdir)
  assert "resumed rl at step 2" in out.stdout + out.stderr
  assert _rows(workdir) == first

  merged, start = load_file(workdir / "export" / "model.safetensors"), load_file(base / "model.safetensors")
  assert set(merged) == set(start)  # the plain model's tensors, no adapter
  q = "model.layers.0.self_attn.q_proj.weight"
  assert np.abs(merged[q] - start[q]).max() > 0  # adapters merged into the targeted kernels
  for name in ("model.embed_tokens.weight", "model.norm.weight"):
    np.testing.assert_array_equal(merged[name], start[name])  # the frozen rest exported as loaded
  adapters = load_file(workdir / "export_adapters" / "adapter_model.safetensors")  # and the adapters alone (PEFT)
  assert json.loads((workdir / "export_adapters" / "adapter_config.json").read_text())["r"] == 4
  assert any(k.endswith("q_proj.lora_B.weight") for k in adapters)


def test_embedded_qwen3vl_lora_run_with_cispo_on_the_samplers_log_probs(tmp_path):
  """The embedded student (no checkpoint: its base is built by the run) under LoRA, as a Qwen3-VL with the paged
  rollout engine (the trainer's rollouts and update with DeepStack, with no other family branch): SFT trains the
  base with the adapters held at zero (its moments are the base's), RL the adapters alone, so RL's first policy is
  the SFT policy and its KL to the base (adapters off) is exactly 0 at that step. RL runs `rl.loss.policy=cispo`
  from the command line with the old log-probs taken from the sampler (no recompute): the mismatch metrics are then
  logged without being computed, the divergences 0, the log-perplexities null (not measured). GSPO runs in
  tests/train/test_rollout_engine_config.py."""
  workdir = tmp_path / "run"
  changes = {
    "model.family": "qwen3_vl",
    "rl.loss.policy": "cispo",
    "rl.recompute_old_logprobs": False,
    "rollout.engine": "paged",
    "rollout.slots": 4,
    "model.lora.rank": 4,
    "rl.loss.kl_coef": 0.05,
    "rl.loss.entropy_coef": 0.01,  # a gradient whatever the rewards (the tiny run's are often flat in a group)
    "rl.optim.warmup_steps": 0,
    "checkpoint.every": 1,
    "checkpoint.max_to_keep": 4,
    "export.hf": True,
  }
  launch("caprl", *tiny_run(changes), workdir=workdir)
  moments = {}
  for step, phase in ((2, "sft"), (4, "rl")):
    tree = json.loads((workdir / "checkpoints" / str(step) / "state" / "_METADATA").read_text())["tree_metadata"]
    opt = [k for k in tree if k.startswith("('opt_state'") and ("kernel" in k or "embedding" in k)]
    moments[phase] = opt
    assert any(k.startswith("('params'") and "_lora_" in k for k in tree)  # the adapters are in both phases' params
  assert moments["sft"] and not any("_lora_" in k for k in moments["sft"])  # SFT: the base's moments only
  assert moments["rl"] and all("_lora_" in k for k in moments["rl"])  # RL: the adapters' only
  kl = [r["kl"] for r in _rows(workdir) if "kl" in r]
  assert len(kl) == 2 and kl[0] == 0.0 and kl[1] > 0  # RL starts at its reference, the SFT policy
  assert (workdir / "export" / "model.safetensors").exists()
  rl = [r for r in _rows(workdir) if r["phase"] == "rl" and "loss" in r]
  assert [r["step"] for r in rl] == [1, 2] and all(isinstance(r["loss"], float) for r in rl)
  assert json.loads((workdir / "config.json").read_text())["config"]["rl"]["loss"]["policy"] == "cispo"
  for r in rl:
    assert r["rollout_corr/kl_k1"] == r["rollout_corr/chi2_token"] == 0.0
    assert r["rollout_corr/training_log_ppl"] is None and r["rollout_corr/rollout_log_ppl"] is None
