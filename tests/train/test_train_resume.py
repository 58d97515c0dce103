"""The main job end to end on a small budget: it runs, checkpoints, evaluates, exports and compiles each of its
programs once. That a SIGKILLed run resumes to the same metrics and rollout records as an uninterrupted one is
tests/train/test_filter_groups_run.py (with the loader's refills) and tests/train/test_off_policy.py (with a queued
round)."""

import collections
import json
from pathlib import Path

import pytest

from processes import SMALL, compiles, cpu_env, launch, tiny_run

pytestmark = pytest.mark.slow  # launches training runs in subprocesses

# 4 SFT + 6 RL steps, a checkpoint every 2 and a held-out evaluation every 2 RL steps, with
# rollout records at every RL step, the export and the curves
RUN = tiny_run({"export.hf": None, "logging.curves": None, "logging.rollouts_every": 1}, base=SMALL)


def _metrics(workdir):
  rows = [json.loads(line) for line in (Path(workdir) / "metrics.jsonl").read_text().splitlines()]
  return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


@pytest.fixture(scope="module")
def uninterrupted_run(tmp_path_factory):
  """(workdir, stderr) of the run, logging every compilation."""
  workdir = tmp_path_factory.mktemp("full")
  out = launch("caprl", *RUN, workdir=workdir, env=cpu_env(1, JAX_LOG_COMPILES="1"))
  return workdir, out.stderr


@pytest.fixture(scope="module")
def uninterrupted(uninterrupted_run):
  return uninterrupted_run[0]


def test_run_writes_everything(uninterrupted):
  w = uninterrupted
  assert (w / "curves.png").stat().st_size > 0
  assert (w / "export" / "model.safetensors").exists() and (w / "export" / "tokenizer.json").exists()
  summary = json.loads((w / "summary.json").read_text())
  assert {"sft_end", "rl_start", "rl_end"} <= set(summary)
  from jaxcap.eval.captioners import read_caption_jsonl  # held-out captions the evaluator reads

  for name in ("sft_end", "rl_end"):
    assert len(read_caption_jsonl(w / "captions" / f"{name}.jsonl").captions) == 8
  rows = _metrics(w)
  assert [r["step"] for r in rows if r["phase"] == "rl" and "loss" in r] == [1, 2, 3, 4, 5, 6]
  assert any((w / "tensorboard").iterdir())


def test_each_program_compiles_once(uninterrupted_run):
  """The update steps, the log-prob pass and the sampler's prefill / decode (one per sampling configuration: RL's
  and the greedy evaluation's) compile once each, however many steps, evaluations and checkpoints the run takes
  (5 checkpoints, 5 evaluations, 2 phases)."""
  found = compiles(uninterrupted_run[1])
  by_name = collections.Counter(name for name, _ in found)
  want = {"sft_step": 1, "rl_step": 1, "sequence_logprobs": 1, "prefill": 2, "decode": 2}
  assert {k: by_name[k] for k in want} == want, by_name
  # no program of the run is compiled twice for the same arguments
  big = [(n, sig) for n, sig in found if n in want]
  assert len(set(big)) == len(big)
