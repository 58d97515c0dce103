"""What a workdir holds, read into one JSON-able document for the page. Every file is optional and read as it is
now (a run in progress has a metrics.jsonl whose last line may be half written, and no RL-end captions yet):

    metrics.jsonl            -> curves: {phase: {key: [[step, value], ...]}} (finite numbers only)
    rollouts/step_*.jsonl    -> steps: [{step, groups}] (jaxcap.train.logs.rollout_records), captions flagged
    captions/<phase>_<tag>.jsonl -> held-out: per image, the SFT-end caption beside the RL-end one, with scores
    **/report.json (jaxcap.eval) -> evals: per image, each captioner's headline metrics (and captions)
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterator

from jaxcap.inspect.flags import caption_flags
from jaxcap.inspect.media import Thumbnails
from jaxcap.train.logs.rollout_records import FILE_RE

# The held-out caption sets the comparison view pairs, in order of preference for each side.
BEFORE = ("sft_end", "rl_start", "sft_start")
AFTER = ("rl_end",)


def json_lines(path: Path) -> Iterator[dict]:
  """The objects of a JSONL file; a line that does not parse (one being written) is skipped."""
  try:
    text = path.read_text()
  except OSError:
    return
  for line in text.splitlines():
    try:
      row = json.loads(line)
    except json.JSONDecodeError:
      continue
    if isinstance(row, dict):
      yield row


def _number(v) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def curves(workdir: Path) -> dict[str, dict[str, list]]:
  out: dict[str, dict[str, list]] = {}
  for row in json_lines(workdir / "metrics.jsonl"):
    phase, step = row.get("phase"), row.get("step")
    for k, v in row.items():
      if k not in ("phase", "step") and _number(v) and isinstance(step, int):
        out.setdefault(str(phase), {}).setdefault(k, []).append([step, v])
  return out


def rollout_steps(workdir: Path, thumbs: Thumbnails) -> list[dict]:
  directory = workdir / "rollouts"
  files = sorted(directory.glob("step_*.jsonl")) if directory.is_dir() else []
  steps = []
  for path in files:
    m = FILE_RE.match(path.name)
    if not m:
      continue
    groups = list(json_lines(path))
    for group in groups:
      group["thumb"] = thumbs.url(group.get("media", ""))
      for s in group.get("samples", []):
        s["flags"] = caption_flags(s.get("caption", ""))
    steps.append({"step": int(m.group(1)), "groups": groups})
  return steps


def _media_index(workdir: Path, config: dict) -> dict[str, str]:
  """Held-out image id -> its media path (the eval manifest's, in any form `read_manifest` reads, else the
  synthetic world's); empty when it cannot be read (the page shows captions without thumbnails)."""
  from jaxcap.data.manifest import ManifestError, read_manifest

  manifest = (config.get("data") or {}).get("eval_manifest") or ""
  source = manifest or str(workdir / "world" / "heldout" / "manifest.jsonl")
  try:
    records = read_manifest(source, require_media=False).records
  except (ManifestError, OSError):
    return {}
  return {r.id: r.image or (r.frames[0] if r.frames else "") for r in records}


def _caption_sets(workdir: Path) -> dict[str, dict[str, dict]]:
  directory = workdir / "captions"
  sets = {}
  for path in sorted(directory.glob("*.jsonl")) if directory.is_dir() else []:
    sets[path.stem] = {str(r["id"]): r for r in json_lines(path) if "id" in r}
  return sets


def _side(row: dict | None) -> dict | None:
  if row is None:
    return None
  caption = row.get("caption", "")
  keep = ("qa_accuracy", "reward", "words")
  return {"caption": caption, "flags": caption_flags(caption), **{k: row.get(k) for k in keep if k in row}}


def heldout(workdir: Path, config: dict, thumbs: Thumbnails) -> dict:
  """The comparison of the SFT-end (or RL-start) captions with the RL-end ones, one pair per image; a side whose
  file is not written yet (a run in progress) is null."""
  sets = _caption_sets(workdir)
  before = next((n for n in BEFORE if n in sets), None)
  after = next((n for n in AFTER if n in sets), None)
  ids = list(dict.fromkeys([*sets.get(before, {}), *sets.get(after, {})]))
  media = _media_index(workdir, config) if ids else {}
  rows = []
  for i in ids:
    left, right = sets.get(before, {}).get(i), sets.get(after, {}).get(i)
    rows.append({"id": i, "thumb": thumbs.url(media.get(i, "")), "left": _side(left), "right": _side(right)})
  return {"sets": sorted(sets), "left": before, "right": after, "rows": rows}


def _captions_of(spec: str, root: Path) -> dict[str, str]:
  path = spec[len("jsonl:") :] if spec.startswith("jsonl:") else spec
  if not path.endswith(".jsonl"):
    return {}
  p = Path(path) if Path(path).is_absolute() else root / path
  if not p.exists():
    p = Path(path)
  return {str(r["id"]): r.get("caption", (r.get("captions") or [""])[0]) for r in json_lines(p) if "id" in r}


def eval_reports(workdir: Path, thumbs: Thumbnails, extra: list[Path] = ()) -> list[dict]:
  """Every jaxcap.eval report.json under the workdir (and `extra` ones): per image, each captioner's headline
  metric values and, when the report's caption files can be read, their captions."""
  skip = {"checkpoints", "compile_cache", "wandb", "mlruns", "tensorboard", "rollouts", "world", "export", "site"}
  found = [p for d in workdir.iterdir() if d.is_dir() and d.name not in skip for p in d.rglob("report.json")]
  paths = [*sorted(found), *extra]
  out = []
  for path in dict.fromkeys(paths):
    try:
      doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
      continue
    if "models" not in doc or "image_ids" not in doc:
      continue
    settings = doc.get("settings") or {}
    media = _media_index(workdir, {"data": {"eval_manifest": settings.get("manifest", "")}})
    specs = settings.get("captioners") or {}
    captions = {m["name"]: _captions_of(str(specs.get(m["name"], "")), Path.cwd()) for m in doc["models"]}
    headline = [h for h in doc.get("headline", [])]
    images = []
    for n, image_id in enumerate(doc["image_ids"]):
      values = {m["name"]: {h: _image_value(m, h, n) for h in headline} for m in doc["models"]}
      caps = {name: c.get(image_id) for name, c in captions.items() if c.get(image_id) is not None}
      images.append({"id": image_id, "thumb": thumbs.url(media.get(image_id, "")), "values": values, "captions": caps})
    estimates = {m["name"]: {h: (m.get("estimates") or {}).get(h) for h in headline} for m in doc["models"]}
    name = str(Path(path).parent.relative_to(workdir)) if Path(path).is_relative_to(workdir) else str(path)
    out.append({"name": name, "models": [m["name"] for m in doc["models"]], "headline": headline, "images": images,
                "estimates": estimates})  # fmt: skip
  return out


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


def load_run(workdir: Path, site: Path, eval_reports_extra: list[Path] = ()) -> dict[str, Any]:
  """The page's document for `workdir`, thumbnails written under `site`/media."""
  workdir = Path(workdir).resolve()
  saved = json.loads((workdir / "config.json").read_text()) if (workdir / "config.json").exists() else {}
  config = saved.get("config", saved)  # jaxcap.train.shell.resume.record's {"config": ..., "runtime": ...}
  thumbs = Thumbnails(site, [workdir, Path.cwd()])
  summary = json.loads((workdir / "summary.json").read_text()) if (workdir / "summary.json").exists() else None
  return {
    "run": {
      "name": config.get("name", workdir.name),
      "workdir": str(workdir),
      "finished": summary is not None,
      "summary": {k: v for k, v in (summary or {}).items() if isinstance(v, dict) and not k.endswith("_samples")},
    },
    "curves": curves(workdir),
    "steps": rollout_steps(workdir, thumbs),
    "heldout": heldout(workdir, config, thumbs),
    "evals": eval_reports(workdir, thumbs, list(eval_reports_extra)),
  }
