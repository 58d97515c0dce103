"""jaxcap.eval reports (report.json, jaxcap.eval.report.EvalReport's document) as the page shows them: per report,
each captioner's headline estimates (mean and bootstrap interval, and the paired difference to `compared_to`), and
per image each captioner's value and caption, with the image's reference caption."""

from __future__ import annotations

import json
from pathlib import Path

from jaxcap.inspect.jsonl import json_lines
from jaxcap.inspect.media import Thumbnails
from jaxcap.inspect.truth import TruthIndex

# Workdir folders that never hold an eval report (searching them is slow: checkpoints, caches, media).
SKIP = {"checkpoints", "compile_cache", "wandb", "mlruns", "tensorboard", "rollouts", "world", "export", "site"}


def _captions_of(spec: str, root: Path) -> dict[str, str]:
  """image id -> caption of a `jsonl:` captioner spec (other kinds of captioner have no file to read: {})."""
  path = spec[len("jsonl:") :] if spec.startswith("jsonl:") else spec
  if not path.endswith(".jsonl"):
    return {}
  p = Path(path) if Path(path).is_absolute() else root / path
  if not p.exists():
    p = Path(path)
  return {str(r["id"]): r.get("caption", (r.get("captions") or [""])[0]) for r in json_lines(p) if "id" in r}


def _estimate(e) -> dict | None:
  """{mean, low, high, count} of an Estimate's document (None where the report has none); an older or
  hand-written report's {"value": v} is read as the mean without an interval."""
  if not isinstance(e, dict):
    return None
  mean = e.get("mean", e.get("value"))
  return {"mean": mean, "low": e.get("low"), "high": e.get("high"), "count": e.get("count")}


def _image_value(model: dict, metric: str, n: int) -> float | None:
  if metric in (model.get("metrics") or {}):
    m = model["metrics"][metric]
    num, den = m["num"][n], m["den"][n]
    return num / den if den else None
  values = (model.get("composite_values") or {}).get(metric)
  if values is not None and n < len(values):
    return values[n]
  if metric == "length/words" and n < len(model.get("lengths", [])):
    return model["lengths"][n]
  return None


def eval_reports(workdir: Path, thumbs: Thumbnails, truth: TruthIndex, extra: list[Path] = ()) -> list[dict]:
  """Every jaxcap.eval report.json under the workdir (and `extra` ones), as the page's eval documents."""
  found = [p for d in workdir.iterdir() if d.is_dir() and d.name not in SKIP for p in d.rglob("report.json")]
  out = []
  for path in dict.fromkeys([*sorted(found), *extra]):
    try:
      doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
      continue
    if "models" not in doc or "image_ids" not in doc:
      continue
    out.append(_report(doc, Path(path), workdir, thumbs, truth))
  return out


def _report(doc: dict, path: Path, workdir: Path, thumbs: Thumbnails, truth: TruthIndex) -> dict:
  settings = doc.get("settings") or {}
  manifest = str(settings.get("manifest", "") or "")
  specs = settings.get("captioners") or {}
  names = [m["name"] for m in doc["models"]]
  captions = {m["name"]: _captions_of(str(specs.get(m["name"], "")), Path.cwd()) for m in doc["models"]}
  headline = list(doc.get("headline", []))
  images = []
  for n, image_id in enumerate(doc["image_ids"]):
    confine = {k: settings[k] for k in ("media_root", "allow_outside_paths") if settings.get(k)}
    known = truth.lookup("heldout", image_id, manifest or None, confine)
    values = {m["name"]: {h: _image_value(m, h, n) for h in headline} for m in doc["models"]}
    caps = {name: c.get(image_id) for name, c in captions.items() if c.get(image_id) is not None}
    images.append(
      {"id": image_id, "thumb": thumbs.url(known.get("media", "")), "reference": known.get("reference", ""),
       "values": values, "captions": caps}
    )  # fmt: skip
  estimates = {m["name"]: {h: _estimate((m.get("estimates") or {}).get(h)) for h in headline} for m in doc["models"]}
  differences = {name: {h: _estimate(d.get(h)) for h in headline} for name, d in (doc.get("differences") or {}).items()}
  name = str(path.parent.relative_to(workdir)) if path.is_relative_to(workdir) else str(path)
  return {"name": name, "models": names, "headline": headline, "images": images, "estimates": estimates,
          "compared_to": doc.get("compared_to", ""), "differences": differences, "judge": doc.get("judge", "")}  # fmt: skip
