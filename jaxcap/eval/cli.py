"""What `python -m jaxcap.eval` does, as functions: config -> judge, records, captioners -> report files.

Config keys (see configs/eval.py): manifest (empty: generate a synthetic world under out_dir), synthetic,
judge, captioners ("NAME=SPEC", ...), baselines {name: spec}, honest (spec or ""), suites, per-suite options,
bootstrap, out_dir. Captioner specs are described in `jaxcap.eval.captioners`.
"""

from __future__ import annotations

import pathlib
from typing import Any, Mapping, Sequence

from jaxcap.eval.captionqa import CaptionQAConfig
from jaxcap.eval.caparena import CapArenaConfig
from jaxcap.eval.captioners import load_captioner
from jaxcap.eval.dcscore import DCScoreConfig
from jaxcap.eval.evaluate import SUITES, EvalConfig, evaluate
from jaxcap.eval.prism import PrismConfig
from jaxcap.eval.redteam import RedTeamConfig
from jaxcap.eval.report import write_report
from jaxcap.judges.factory import build_judge, judge_name


def _plain(value: Any) -> Any:
  """ConfigDict / FrozenConfigDict -> plain dicts and lists, recursively."""
  if hasattr(value, "to_dict"):
    value = value.to_dict()
  if isinstance(value, Mapping):
    return {k: _plain(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_plain(v) for v in value]
  return value


def parse_captioner_flags(pairs: Sequence[str]) -> dict[str, str]:
  """["sft=runs/sft.jsonl", "rl=runs/rl.jsonl"] -> {"sft": ..., "rl": ...}."""
  out = {}
  for pair in pairs:
    name, sep, spec = pair.partition("=")
    if not sep or not name or not spec:
      raise ValueError(f"Captioner {pair!r}: write NAME=SPEC, e.g. rl=jsonl:runs/rl/captions.jsonl.")
    out[name] = spec
  return out


def eval_config(config: Mapping[str, Any]) -> EvalConfig:
  suites = [s.strip() for s in config["suites"].split(",") if s.strip()]
  unknown = set(suites) - set(SUITES) - {"redteam"}
  if unknown:
    raise ValueError(f"config.suites has unknown suites {sorted(unknown)}; use any of {SUITES + ('redteam',)}.")
  rt = config.get("redteam", {})
  masked = tuple(rt.get("length_masked_rewards", ("balcaprl/linguistic",)))
  redteam = RedTeamConfig(**(rt | {"length_masked_rewards": masked})) if "redteam" in suites else None
  qa = config.get("captionqa", {})
  return EvalConfig(
    suites=tuple(s for s in suites if s != "redteam"),
    prism=PrismConfig(**config.get("prism", {})),
    captionqa=CaptionQAConfig(**(qa | {"word_limits": tuple(qa.get("word_limits", (50, 100, 200)))})),
    dcscore=DCScoreConfig(**config.get("dcscore", {})),
    caparena=CapArenaConfig(**config.get("caparena", {})),
    bcapscore_captionqa_metric=config.get("bcapscore_captionqa_metric", "captionqa/full"),
    redteam=redteam,
    compare_to=str(config.get("compare_to", "")),
    bootstrap_resamples=int(config["bootstrap"]["resamples"]),
    confidence=float(config["bootstrap"]["confidence"]),
    seed=int(config["bootstrap"]["seed"]),
  )


def run(config: Any, captioner_overrides: Mapping[str, str] | None = None) -> dict[str, pathlib.Path]:
  """Evaluates the configured captioners and writes the report; returns the written files by kind."""
  from jaxcap.data.manifest import read_manifest
  from jaxcap.data.synthetic.manifest import generate_dataset

  config = _plain(config)
  settings = eval_config(config)  # validate before any work
  out_dir = pathlib.Path(config["out_dir"])
  manifest = config.get("manifest") or ""
  if not manifest:
    syn = config.get("synthetic", {})
    manifest = generate_dataset(
      out_dir / "synthetic_world",
      int(syn.get("num_scenes", 24)),
      seed=int(syn.get("seed", 0)),
      questions_per_scene=int(syn.get("questions_per_scene", 5)),
    )
  records, scenes = read_manifest(manifest, require_media=False)
  judge_cfg = config.get("judge", {})
  judge = build_judge(judge_cfg, scenes=scenes, records=records)
  specs = dict(captioner_overrides) if captioner_overrides else parse_captioner_flags(config["captioners"])
  if not specs:
    raise ValueError("No captioners to evaluate; set config.captioners or pass --captioner NAME=SPEC.")
  samples = int(config.get("samples_per_image", 1))
  captioners = [load_captioner(name, spec, records, num_samples=samples) for name, spec in specs.items()]
  baselines = {name: load_captioner(name, spec, records) for name, spec in config.get("baselines", {}).items()}
  honest = load_captioner("honest", config["honest"], records) if config.get("honest") else None
  report = evaluate(
    judge,
    records,
    captioners,
    baselines=baselines,
    honest=honest,
    config=settings,
    judge_name=judge_name(judge_cfg),
    settings={"manifest": str(manifest), "captioners": specs},
  )
  return write_report(report, out_dir)
