"""The report renders (Markdown + PNG), its JSON round-trips, captioner sources load, and the CLI runs."""

import json

import pytest
from eval_world import builtin, world

from jaxcap.eval.captioners import CaptionSet, captions_from_fn, load_captioner, read_caption_jsonl, write_caption_jsonl
from jaxcap.eval.evaluate import EvalConfig, evaluate
from jaxcap.eval.redteam import RedTeamConfig
from jaxcap.eval.render import write_report
from jaxcap.eval.report import EvalReport
from processes import cli

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def report():
  _, records, judge = world()
  records = records[:8]
  sampled = CaptionSet("sampled", {r.id: (r.teacher_captions["poetic"], r.reference_caption) for r in records})
  config = EvalConfig(bootstrap_resamples=50, redteam=RedTeamConfig(families={"caprl": {"caprl": {}}}))
  return evaluate(
    judge,
    records,
    [builtin("reference", records), sampled, builtin("empty", records)],
    baselines={"student": builtin("student", records)},
    honest=builtin("reference", records),
    config=config,
    judge_name="rule_based",
  )


def test_json_round_trips(report, tmp_path):
  doc = report.to_json()
  assert EvalReport.from_json(doc) == report
  assert EvalReport.from_json(json.loads(json.dumps(doc))).to_json() == doc
  report.save(tmp_path / "r.json")
  assert EvalReport.load(tmp_path / "r.json") == report
  with pytest.raises(ValueError, match="format_version"):
    EvalReport.from_json(doc | {"format_version": 99})


def test_best_of_n_uses_every_sample(report):
  sampled = report.model("sampled")
  assert sampled.samples_per_image == 2
  # The second sample is the reference, which answers everything: best-of-2 is perfect, the mean is not.
  assert sampled.estimates["prism/best@n"].mean == 100.0 > sampled.estimates["prism/mean@n"].mean


def test_report_renders_markdown_and_png(report, tmp_path):
  paths = write_report(report, tmp_path / "out")
  for kind in ("length_plot", "metric_plot"):
    data = paths[kind].read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 5000, kind
  md = paths["markdown"].read_text()
  assert "![Caption length distribution](plots/length_distribution.png)" in md
  assert "![Metric vs caption length](plots/metric_vs_length.png)" in md
  header = next(line for line in md.splitlines() if line.startswith("| captioner | Prism"))
  for title in ("Prism mean@n", "CaptionQA@100w", "DCScore", "CapArena", "b-CapScore", "words"):
    assert f" {title} |" in header, title
  ref_row = next(line for line in md.splitlines() if line.startswith("| reference | 100.0 ["))
  assert ref_row.count("[") == header.count("|") - 2  # every cell carries a bootstrap interval
  assert "## Reward-hacking red team" in md and "| prompt_injection |" in md
  assert EvalReport.load(paths["json"]) == report


def test_caption_jsonl_round_trip_and_errors(tmp_path):
  path = tmp_path / "caps.jsonl"
  path.write_text(
    '{"id": "a", "caption": "one"}\n{"id": "a", "caption": "two"}\n\n{"image_id": "b", "captions": ["x", "y"]}\n'
  )
  caps = read_caption_jsonl(path, "m")
  assert caps.captions == {"a": ("one", "two"), "b": ("x", "y")}
  write_caption_jsonl(caps, tmp_path / "back.jsonl")
  assert read_caption_jsonl(tmp_path / "back.jsonl", "m") == caps
  (tmp_path / "bad.jsonl").write_text('{"caption": "no id"}\n')
  with pytest.raises(ValueError, match="bad.jsonl:1 has no 'id'"):
    read_caption_jsonl(tmp_path / "bad.jsonl")
  with pytest.raises(FileNotFoundError, match="jaxcap.caption"):
    load_captioner("m", "jsonl:" + str(tmp_path / "missing.jsonl"), [])
  with pytest.raises(ValueError, match="lacks captions for 1 of 2"):
    caps.check_covers([type("R", (), {"id": "a"})(), type("R", (), {"id": "zzz"})()])


def test_callable_captioner_adapter():
  records = world()[1][:5]
  calls = []

  def caption_fn(batch):
    calls.append(len(batch))
    return [r.reference_caption for r in batch]

  caps = captions_from_fn("fn", caption_fn, records, num_samples=2, batch_size=2)
  assert calls == [2, 2, 1, 2, 2, 1]
  assert all(caps.samples(r.id) == (r.reference_caption,) * 2 for r in records)
  with pytest.raises(ValueError, match="one caption per record"):
    captions_from_fn("bad", lambda batch: [], records)


@pytest.mark.slow
def test_cli_compares_jsonl_captioners(tmp_path):
  manifest, records, _ = world()
  for name, kind in (("sft", "poetic"), ("rl", "meticulous")):
    write_caption_jsonl(
      CaptionSet(name, {r.id: (r.teacher_captions[kind],) for r in records}), tmp_path / f"{name}.jsonl"
    )
  out = tmp_path / "report"
  cli(
    "eval",
    "--config=configs/eval.py",
    f"--config.manifest={manifest}",
    f"--config.out_dir={out}",
    "--config.bootstrap.resamples=20",
    "--config.suites=captionqa,dcscore,caparena",
    f"--captioner=sft=jsonl:{tmp_path / 'sft.jsonl'}",
    f"--captioner=rl=jsonl:{tmp_path / 'rl.jsonl'}",
    timeout=120,
  )
  report = EvalReport.load(out / "report.json")
  assert [m.name for m in report.models] == ["sft", "rl"] and report.redteam == ()
  assert report.model("rl").estimates["bcapscore"].mean > report.model("sft").estimates["bcapscore"].mean
  # The gain of the second captioner over the first, with a paired interval that excludes 0.
  assert report.compared_to == "sft" and set(report.differences) == {"rl"}
  gain = report.differences["rl"]["dcscore/f1"]
  assert gain.low > 0 and gain.mean == pytest.approx(
    report.model("rl").estimates["dcscore/f1"].mean - report.model("sft").estimates["dcscore/f1"].mean
  )
  assert "## Difference from sft" in (out / "report.md").read_text()
  assert (out / "report.md").exists() and (out / "plots" / "metric_vs_length.png").exists()


def test_judge_factory_from_config():
  from jaxcap.judges.factory import JUDGE_KINDS, build_judge, judge_name
  from jaxcap.judges.settings import JudgeConfig
  from jaxcap.world.judge import RuleBasedJudge

  cfg = JudgeConfig(kind="factory", factory="eval_world:make_world_judge", options={"failure_rate": 0.25})
  judge = build_judge(cfg)
  assert isinstance(judge, RuleBasedJudge) and judge.failure_rate == 0.25
  assert judge_name(cfg) == "eval_world:make_world_judge"
  with pytest.raises(TypeError, match="lacks the jaxcap.judges.protocol.Judge methods"):
    build_judge(JudgeConfig(kind="factory", factory="eval_world:make_not_a_judge"))
  with pytest.raises(ValueError, match="needs ground-truth scenes"):
    build_judge(JudgeConfig(kind="rule_based"))
  with pytest.raises(
    ValueError, match=r"judge.kind='llm': unknown judge kind; choose one of http, factory, none, rule_based"
  ):
    build_judge(JudgeConfig(kind="llm"))
  # the trainer's, eval's and the CLIs' judge blocks are one config with one vocabulary
  assert set(JUDGE_KINDS) == {"rule_based", "http", "factory", "none"} and JudgeConfig().kind in JUDGE_KINDS
