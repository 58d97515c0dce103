"""Streaming judging (rl.stream_judging) in the main job end to end: with the paged engine each group is judged as
soon as it is decoded, and a run of the same seed writes the same metrics and rollout records (rewards, masks of
failed judgments, judge evidence) as one that judges each batch after its rollout. The runs are one-step
off-policy, which covers both paths: RL step 1 rolls out and judges its own batch (the on-policy step), steps 2 and
3 train on the round queued (rolled out and streamed to the judge) during the step before."""

import json
from pathlib import Path

import pytest

from processes import ROOT, launch, tiny_run

pytestmark = pytest.mark.slow  # launches training runs in subprocesses

SCRIPT = str(Path(ROOT) / "tests" / "train" / "spread_reward_launch.py")  # rewards that spread within groups
# 3 RL steps of 4 prompts x 4 samples through the paged engine (few slots: groups finish at different segments),
# three in ten judgments failing (masked and counted), rollout records with the judge's evidence at every step
RUN = tiny_run(
  {
    "rl.steps": 3,
    "rl.batch_size": 4,
    "rl.num_samples": 4,
    "sampling.max_new_tokens": 12,
    "rollout.engine": "paged",
    "rollout.slots": 6,
    "rollout.segment_steps": 4,
    "judge.failure_rate": 0.3,
    "logging.rollouts_every": 1,
  }
)


def _metrics(workdir):
  rows = [json.loads(line) for line in (Path(workdir) / "metrics.jsonl").read_text().splitlines()]
  return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def _records(workdir):
  return {p.name: p.read_text().replace(str(workdir), "<workdir>") for p in sorted((workdir / "rollouts").iterdir())}


def test_streamed_run_equals_the_batch_judged_one(tmp_path):
  runs = {}
  for stream in (False, True):
    workdir = tmp_path / f"stream_{stream}"
    flags = [f"--config.rl.stream_judging={stream}", "--config.rl.off_policy_steps=1"]
    launch("caprl", *RUN, *flags, workdir=workdir, script=SCRIPT)
    runs[stream] = workdir
  want, got = _metrics(runs[False]), _metrics(runs[True])
  rl = [r for r in want if r["phase"] == "rl" and "loss" in r]
  assert [(r["step"], r["offpolicy/staleness"]) for r in rl] == [(1, 0.0), (2, 1.0), (3, 1.0)]
  assert any(r["judge/failed/refused"] > 0 for r in rl) and any(0 < r["judge/valid_fraction"] < 1 for r in rl)
  assert got == want
  assert len(_records(runs[True])) == 3 and _records(runs[True]) == _records(runs[False])
