"""Runs a suite: the shared starts, every (arm, seed), the per-image metrics, paired bootstrap CIs per claim, and
the report (`<workdir>/<suite>/report.md`, `report.json`, one PNG per experiment)."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

import jaxcap.world  # noqa: F401  (registers judge.kind='rule_based')
from jaxcap.eval.captioners import read_caption_jsonl
from jaxcap.eval.metrics import RatioMetric
from jaxcap.experiments import measure
from jaxcap.experiments.runs import ArmRun, Settings, Start, ensure_arm, ensure_start
from jaxcap.experiments.spec import SUITES, load_experiment
from jaxcap.experiments.summary import summarise
from jaxcap.experiments.training_log import training_extras

MEASURE_VERSION = 2  # bump when a metric's definition changes: cached measurements are then recomputed


@dataclasses.dataclass
class Measured:
  """One (arm, seed)'s per-image metrics and its training log's summaries."""

  metrics: dict[str, RatioMetric]
  extras: dict[str, float]


def _load_measured(path: Path, key: str) -> Measured | None:
  if not path.exists():
    return None
  d = json.loads(path.read_text())
  if d.get("key") != key:
    return None
  return Measured({k: RatioMetric.from_arrays(*v) for k, v in d["metrics"].items()}, d["extras"])


def _save_measured(path: Path, key: str, m: Measured) -> None:
  metrics = {k: [list(v.num), list(v.den)] for k, v in m.metrics.items()}
  path.write_text(json.dumps({"key": key, "metrics": metrics, "extras": m.extras}))


class SuiteRunner:
  """Trains and measures what the chosen experiments need, then writes their report."""

  def __init__(self, suite: str, settings: Settings, only: Sequence[str] = (), log=print):
    if suite not in SUITES:
      raise ValueError(f"suite {suite!r}: known suites are {', '.join(SUITES)}")
    names = list(only) or list(SUITES[suite])
    self.suite, self.settings, self.log = suite, settings, log
    self.experiments = {n: load_experiment(n) for n in names}
    self.starts: dict[str, Start] = {}
    self._eval: dict[str, Any] = {}

  def arms(self, exp) -> dict[str, dict]:
    names = exp.smoke_arms if self.settings.smoke else list(exp.order)
    return {n: dict(exp.arms[n].to_dict()) for n in names}

  def start(self, kind: str) -> Start:
    if kind not in self.starts:
      self.starts[kind] = ensure_start(kind, self.settings, log=self.log)
    return self.starts[kind]

  def heldout(self, start: Start):
    """(records, judge, start captions) of a start's held-out world (the first eval images)."""
    key = str(start.workdir)
    if key not in self._eval:
      from jaxcap.data.manifest import read_manifest
      from jaxcap.judges.factory import build_judge
      from jaxcap.judges.settings import JudgeConfig

      manifest = read_manifest(start.heldout_manifest)
      n = self.settings.eval_images if not self.settings.smoke else 32
      records = manifest.records[:n]
      judge = build_judge(JudgeConfig(), scenes=manifest.scenes, records=records, seed=0)
      self._eval[key] = (records, judge, read_caption_jsonl(start.captions, name="start"))
    return self._eval[key]

  def image_size(self, start: Start) -> int:
    """The square side the start's images were trained at (data.image_size of its config)."""
    return int(json.loads((start.workdir / "start.json").read_text())["config"]["data"]["image_size"])

  def measure(
    self, workdir: Path, captions_path: Path, start: Start, wanted, own_reward, export: Path | None, step_metrics=()
  ):
    key = json.dumps([MEASURE_VERSION, sorted(wanted), own_reward], sort_keys=True)
    cache = workdir / "measured.json"
    cached = _load_measured(cache, key)
    if cached is not None:  # the training log's summaries are cheap: always read afresh
      return Measured(cached.metrics, training_extras(workdir, step_metrics))
    records, judge, start_captions = self.heldout(start)
    captions = read_caption_jsonl(captions_path, name="policy")
    result = measure.caption_metrics(judge, records, captions, start_captions, wanted, own_reward)
    metrics = dict(result.metrics)
    if "vqa" in wanted and export is not None:
      metrics["vqa"] = vqa_metric(export, records, image_size=int(self.image_size(start)))
    m = Measured(metrics, training_extras(workdir, step_metrics))
    _save_measured(cache, key, m)
    return m

  def run(self) -> dict:
    t0 = time.perf_counter()
    out: dict[str, Any] = {"suite": self.suite, "settings": _settings_json(self.settings), "experiments": {}}
    trained_s = reused_s = 0.0
    for name, exp in self.experiments.items():
      self.log(f"== {name}: {exp.title}")
      wanted = list(exp.metrics) + [c["metric"] for c in exp.claims]
      step_metrics = list(exp.get("step_metrics", []))
      arms = self.arms(exp)
      per_arm: dict[str, list[Measured]] = {}
      runs: dict[str, list[ArmRun]] = {}
      kinds = sorted({a["start"] for a in arms.values()})
      for arm_name, arm in arms.items():
        start = self.start(arm["start"])
        own = arm["overrides"].get("reward") or _method_reward(arm["method"])
        own = None if arm["phase"] == "sft" else own
        per_arm[arm_name], runs[arm_name] = [], []
        for seed in self.settings.seeds:
          run = ensure_arm(arm, start, seed, self.settings, export="vqa" in wanted, log=self.log)
          runs[arm_name].append(run)
          if run.reused:
            reused_s += run.wall_s
          else:
            trained_s += run.wall_s
          self.log(
            f"  {arm_name} seed {seed}: {'reused' if run.reused else 'trained'} ({run.wall_s:.0f} s) {run.workdir}"
          )
          export = run.export if "vqa" in wanted else None
          per_arm[arm_name].append(self.measure(run.workdir, run.captions, start, wanted, own, export, step_metrics))
      start_measured = {}
      for kind in kinds:
        start = self.start(kind)
        export = start.export if "vqa" in wanted else None
        start_measured[kind] = self.measure(start.workdir, start.captions, start, wanted, None, export)
      out["experiments"][name] = summarise(exp, arms, per_arm, start_measured, runs)
    for kind, start in self.starts.items():
      out.setdefault("starts", {})[kind] = {
        "workdir": str(start.workdir),
        "wall_s": start.wall_s,
        "reused": start.reused,
      }
    out["wall_s"] = time.perf_counter() - t0
    out["trained_s"], out["reused_s"] = trained_s, reused_s + sum(s.wall_s for s in self.starts.values() if s.reused)
    return out


def _method_reward(method: str) -> dict:
  from jaxcap.experiments.spec import method_config

  return method_config(method).reward.to_dict()


def _settings_json(s: Settings) -> dict:
  return {"rl_steps": s.rl_steps, "seeds": list(s.seeds), "smoke": s.smoke, "eval_images": s.eval_images}


def vqa_metric(export: Path, records, image_size: int) -> RatioMetric:
  """The policy's own VQA accuracy on the held-out (image, question) pairs (jaxcap.eval.vqa)."""
  from jaxcap.checkpoint import checkpoint_dtype, load_hf_checkpoint
  from jaxcap.eval.vqa import vqa_scores
  from jaxcap.processing import Processor

  model = load_hf_checkpoint(str(export), param_dtype=checkpoint_dtype(export))  # as exported (bf16 runs: bf16)
  processor = Processor.from_pretrained(str(export), cfg=model.cfg)  # prompted as trained (jaxcap_prompt.json)
  scores = vqa_scores(model, processor, records, image_size=image_size)
  return RatioMetric.from_arrays(100.0 * np.asarray(scores.num), scores.den)  # percent, as every suite metric
