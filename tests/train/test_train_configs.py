"""Every method's config runs the main job end to end on a tiny budget and logs its own rewards."""

import json
import shutil

import pytest

from processes import TINY, launch, tiny_run

pytestmark = pytest.mark.slow  # launches training runs in subprocesses


@pytest.fixture(scope="module")
def rubicap_run(tmp_path_factory):
  """configs/rubicap.py on the TINY budget: (workdir, its output), shared by the tests that read it."""
  workdir = tmp_path_factory.mktemp("rubicap")
  return workdir, launch("rubicap", *tiny_run(), workdir=workdir)


@pytest.mark.parametrize(
  "config, reward",
  [
    ("rubicap", "reward/rubicap/pass_rate"),
    ("balcaprl", "reward/balcaprl/precision"),
    ("caprl_video", "reward/caprl/accuracy"),
  ],
)
def test_config_runs_and_logs_its_rewards(tmp_path, request, config, reward):
  if config == "rubicap":  # the run the rubric test reads too
    tmp_path = request.getfixturevalue("rubicap_run")[0]
  else:
    launch(config, *tiny_run(), workdir=tmp_path)
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  rl = [r for r in rows if r["phase"] == "rl" and "loss" in r]
  assert len(rl) == 2 and all(reward in r for r in rl)
  if config == "balcaprl":
    assert all(0 <= r["length/in_band"] <= 1 for r in rl)  # the two-sided length mask ran
    end = json.loads((tmp_path / "summary.json").read_text())["rl_end"]
    assert 0 <= end["eval/length_in_band"] <= 1  # ... and held-out evaluation scores the masked reward
    masked = end["eval/balcaprl/linguistic"] <= end["eval/length_in_band"] + 1e-6
    assert masked, end  # linguistic quality is at most 1 inside the band and 0 outside it


def test_sft_config_runs_without_rl(tmp_path):
  launch("sft", *tiny_run({k: None for k in TINY if k.startswith("rl.")}), workdir=tmp_path)
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert {r["phase"] for r in rows} == {"vision", "sft"}  # the embedded student's ViT warm-up, then SFT
  assert [r["step"] for r in rows if r["phase"] == "sft" and "loss" in r] == [1, 2]
  assert [r["step"] for r in rows if r["phase"] == "vision" and "loss" in r] == [1, 2]
  accuracy = json.loads((tmp_path / "summary.json").read_text())["vision_warmup"]
  assert set(accuracy) == {"vision/colour_acc", "vision/shape_acc", "vision/size_acc"}
  assert all(0 <= v <= 1 for v in accuracy.values())
  assert "eval/qa_accuracy" in json.loads((tmp_path / "summary.json").read_text())["sft_end"]


def test_rubicap_rubrics_are_written_against_the_policy_entering_rl(rubicap_run, tmp_path):
  """RubiCap stage 1 runs on the policy's own greedy captions: each held-out rubric's student caption is the
  caption the policy wrote at the start of RL, and that caption fails every criterion of its rubric (they name
  exactly its failures) unless it had none, when the rubric lists the whole consensus and it passes them all."""
  from jaxcap.world.dataset import judge_for_manifest
  from jaxcap.rewards.rubicap import RubiCapReward
  from jaxcap.rewards.rubric import RubricStore

  workdir, out = rubicap_run
  assert "rubrics: 12 written against the policy's captions" in out.stdout + out.stderr
  start = {r["id"]: r["caption"] for r in map(json.loads, open(workdir / "captions" / "rl_start.jsonl"))}
  records, judge = judge_for_manifest(workdir / "world" / "heldout" / "manifest.jsonl")
  store = RubricStore(workdir / "rubrics")
  rubrics = [store.load(r.id) for r in records]
  assert [r.student_caption for r in rubrics] == [start[r.id] for r in records]
  manifest_rubrics = {r.id: r.rubric for r in records}
  assert any(manifest_rubrics[r.image_id].criteria != r.criteria for r in rubrics)  # not the manifest's
  reward = RubiCapReward(judge, store=store)
  rates = reward([start[r.id] for r in records], [r.__class__(id=r.id) for r in records]).values[:, 0]
  from jaxcap.judges.protocol import CoverageRequest

  coverage = judge.match_reference_units([CoverageRequest(r.image_id, r.student_caption, r.consensus) for r in rubrics])
  assert len(rubrics) == len(rates) == len(coverage) > 0
  for rubric, rate, cov in zip(rubrics, rates, coverage, strict=True):
    only_states = all(c.text.startswith("The caption states: ") for c in rubric.criteria)
    no_failures = all(cov.covered) and only_states
    assert rate == (1.0 if no_failures else 0.0), (rubric, rate)
  # A rerun in the same workdir (a copy: the run is shared) finds every step done and every rubric stored: nothing
  # is rewritten.
  shutil.copytree(workdir, tmp_path / "again")
  again = launch("rubicap", *tiny_run(), workdir=tmp_path / "again", check=False)
  assert again.returncode == 0 and "rubrics:" not in again.stdout + again.stderr
