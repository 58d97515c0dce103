"""The evaluator's VQA probe block (`vqa_probe` in configs/eval.py): local HF checkpoints answer the manifest's
multiple-choice questions with the image (`jaxcap.eval.vqa`); the report gets their accuracies with bootstrap
intervals and paired differences against the first checkpoint (`report.json`: "vqa_probe", `report.md`: a table).

Options: checkpoints ("NAME=PATH,NAME=PATH", "" = no probe), batch_size (questions per forward), image_size (square
side in pixels, as training's data.image_size; 0 = native size within the checkpoint's pixel budget), system
("checkpoint": what the checkpoint was trained with (a jaxcap export records it in jaxcap_prompt.json; otherwise
Qwen's default turn), "default": Qwen's system turn, "none": no system turn; else the text), dtype (the weights'
dtype: "checkpoint" = as stored, bf16 for released checkpoints; or "float32" / "bfloat16").
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Mapping, Sequence

import numpy as np

from jaxcap.data.records import ImageRecord
from jaxcap.eval.metrics import Estimate, RatioMetric, bootstrap_differences, bootstrap_estimates

METRIC = "vqa/accuracy"
DEFAULTS = {"checkpoints": "", "batch_size": 16, "image_size": 0, "system": "checkpoint", "dtype": "checkpoint"}


def parse_checkpoints(spec: str | Sequence[str] | Mapping[str, str]) -> dict[str, str]:
  """Checkpoints by name, in order, from "sft=/ckpt/a,rl=/ckpt/b", a list of NAME=PATH or a {NAME: PATH}
  mapping; each PATH must be a checkpoint directory (with config.json)."""
  if isinstance(spec, Mapping):
    spec = [f"{k}={v}" for k, v in spec.items()]
  pairs = [p.strip() for p in spec.split(",")] if isinstance(spec, str) else [str(p).strip() for p in spec]
  out: dict[str, str] = {}
  for pair in filter(None, pairs):
    name, sep, path = pair.partition("=")
    name, path = name.strip(), path.strip()
    if not sep or not name or not path:
      raise ValueError(f"vqa_probe.checkpoints entry {pair!r}: write NAME=PATH (a local HF checkpoint directory).")
    if name in out:
      raise ValueError(f"vqa_probe.checkpoints names {name!r} twice; give each checkpoint its own name.")
    if not (pathlib.Path(path) / "config.json").exists():
      raise ValueError(
        f"vqa_probe.checkpoints {name}={path}: no config.json there; pass a local HF Qwen2.5-VL checkpoint "
        "directory (e.g. a training run's <workdir>/export)."
      )
    out[name] = path
  return out


def probe_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
  """The block with defaults filled and checked; unknown keys are an error naming the allowed ones."""
  options = dict(options or {})
  unknown = set(options) - set(DEFAULTS)
  if unknown:
    raise ValueError(f"vqa_probe has unknown options {sorted(unknown)}; allowed: {sorted(DEFAULTS)}.")
  out = DEFAULTS | options
  if int(out["batch_size"]) < 1:
    raise ValueError(f"vqa_probe.batch_size={out['batch_size']}: must be >= 1.")
  if int(out["image_size"]) < 0:
    raise ValueError(f"vqa_probe.image_size={out['image_size']}: must be >= 0 (0 = native size).")
  from jaxcap.checkpoint.precision import CHOICES

  if out["dtype"] not in CHOICES:
    raise ValueError(f"vqa_probe.dtype={out['dtype']!r}: use one of {', '.join(CHOICES)}.")
  out["checkpoints"] = parse_checkpoints(out["checkpoints"])
  return out


def _system(value: str):
  from jaxcap.processing.chat import DEFAULT_SYSTEM

  return {"default": DEFAULT_SYSTEM, "none": None}.get(value, value)


def run_probe(
  options: Mapping[str, Any],
  records: Sequence[ImageRecord],
  *,
  num_resamples: int = 1000,
  confidence: float = 0.95,
  seed: int = 0,
) -> dict[str, Any]:
  """Loads each checkpoint of `probe_options(options)` in turn, probes it on `records` and returns the report's
  "vqa_probe" document ({} when no checkpoints are configured)."""
  from jaxcap.checkpoint import checkpoint_dtype, load_hf_checkpoint
  from jaxcap.eval.vqa import vqa_scores
  from jaxcap.processing import Processor

  opts = probe_options(options)
  if not opts["checkpoints"]:
    return {}
  metrics = {}
  for name, path in opts["checkpoints"].items():
    system = str(opts["system"])
    processor = Processor.from_pretrained(path, **({} if system == "checkpoint" else {"system": _system(system)}))
    model = load_hf_checkpoint(path, param_dtype=checkpoint_dtype(path, str(opts["dtype"])))
    metrics[name] = vqa_scores(
      model, processor, records, batch_size=int(opts["batch_size"]), image_size=int(opts["image_size"])
    )
    del model  # one checkpoint in memory at a time
  return probe_document(
    metrics,
    records,
    checkpoints=opts["checkpoints"],
    settings={k: opts[k] for k in ("batch_size", "image_size", "system", "dtype")},
    num_resamples=num_resamples,
    confidence=confidence,
    seed=seed,
  )


def probe_document(
  metrics: Mapping[str, RatioMetric],
  records: Sequence[ImageRecord],
  *,
  checkpoints: Mapping[str, str] | None = None,
  settings: Mapping[str, Any] | None = None,
  num_resamples: int = 1000,
  confidence: float = 0.95,
  seed: int = 0,
) -> dict[str, Any]:
  """The JSON document of probe results ({name: `vqa_scores`}, first = reference): per-image num / den, accuracy
  in percent with a percentile bootstrap interval over images, and each later checkpoint minus the first, paired
  (the same resamples)."""
  boot = dict(num_resamples=num_resamples, confidence=confidence, seed=seed)
  percent = {k: RatioMetric.from_arrays(100 * np.asarray(m.num), m.den) for k, m in metrics.items()}
  names = list(percent)
  first = names[0]
  questions = [q for r in records for q in r.questions]
  doc = {
    "metric": METRIC,
    "checkpoints": dict(checkpoints or {}),
    "settings": dict(settings or {}),
    "confidence": confidence,
    "bootstrap_resamples": num_resamples,
    "questions": len(questions),
    "images_with_questions": sum(1 for r in records if r.questions),
    "chance": 100 * float(np.mean([1 / len(q.options) for q in questions])) if questions else None,
    "models": {},
    "compared_to": first,
    "differences": {},
  }
  for name, m in metrics.items():
    est = bootstrap_estimates({METRIC: percent[name]}, **boot)[METRIC]
    doc["models"][name] = {"num": list(m.num), "den": list(m.den), "estimate": dataclasses.asdict(est)}
  for name in names[1:]:
    diff = bootstrap_differences({METRIC: percent[name]}, {METRIC: percent[first]}, **boot)[METRIC]
    doc["differences"][name] = dataclasses.asdict(diff)
  return doc


def render_probe(doc: Mapping[str, Any]) -> list[str]:
  """Markdown lines of the probe's section (none for an empty document)."""
  if not doc or not doc.get("models"):
    return []
  first = doc["compared_to"]
  chance = doc.get("chance")
  out = [
    "",
    "## VQA probe (multiple-choice questions answered with the image)",
    "",
    f"{doc['questions']} questions on {doc['images_with_questions']} images; each checkpoint's answer is the option "
    "letter with the highest next-token logit after the question (jaxcap.eval.vqa). Accuracy in percent with a "
    f"{100 * doc['confidence']:.0f}% percentile bootstrap interval over images ({doc['bootstrap_resamples']} "
    f"resamples); differences paired over images" + (f"; chance {chance:.1f}." if chance is not None else "."),
    "",
    f"| checkpoint | accuracy | minus {first} |",
    "|---|---|---|",
  ]
  for name, row in doc["models"].items():
    diff = doc["differences"].get(name)
    cell = Estimate(**diff).format() if diff else ""
    out.append(f"| {name} | {Estimate(**row['estimate']).format()} | {cell} |")
  return out
