"""What the page shows beside a caption as ground truth: each image's media path, reference caption and curated
questions with their answers, read from the run's manifests (its `data.train_manifest` / `data.eval_manifest`,
else the synthetic world's under <workdir>/world). Rollout records written before they carried their reference
caption get it from here, so older runs show it too.

    index = TruthIndex(workdir, config)
    index.lookup("train", "scene-17") -> {"media": path, "reference": str, "questions": [[question, answer], ...]}
"""

from __future__ import annotations

from pathlib import Path

# How many curated questions of an image the page lists as ground truth (the rest are counted, not shown).
MAX_QUESTIONS = 12


class TruthIndex:
  """Per split ("train", "heldout"), image id -> its ground truth; a manifest is read on first use and one that
  cannot be read is an empty index (the page shows captions without ground truth)."""

  def __init__(self, workdir: Path, config: dict):
    data = config.get("data") or {}
    self.sources = {
      "train": data.get("train_manifest") or str(workdir / "world" / "train" / "manifest.jsonl"),
      "heldout": data.get("eval_manifest") or str(workdir / "world" / "heldout" / "manifest.jsonl"),
    }
    # the run's data root (`jaxcap.data.media_root`): its manifests are read as the run read them
    self.confine = (
      {k: data[k] for k in ("media_root", "allow_outside_paths") if data.get(k)} if data.get("train_manifest") else {}
    )
    self._read: dict[str, dict[str, dict]] = {}

  def split(self, name: str, source: str | None = None, confine: dict | None = None) -> dict[str, dict]:
    """The index of split `name` (or of the manifest `source`, e.g. an eval report's, read under `confine`: the
    report's media_root / allow_outside_paths)."""
    key = source or self.sources[name]
    if key not in self._read:
      self._read[key] = _read(key, self.confine if source is None else (confine or {}))
    return self._read[key]

  def lookup(self, name: str, image_id: str, source: str | None = None, confine: dict | None = None) -> dict:
    """The ground truth of one image; {} when the manifest does not hold it."""
    return self.split(name, source, confine).get(image_id, {})


def _read(source: str, confine: dict) -> dict[str, dict]:
  from jaxcap.data.manifest import ManifestError, read_manifest

  if not source:
    return {}
  try:
    records = read_manifest(source, require_media=False, **confine).records
  except (ManifestError, OSError, ValueError):
    return {}
  out = {}
  for r in records:
    questions = [[q.question, q.answer] for q in r.questions]
    out[r.id] = {
      "media": r.image or (r.frames[0] if r.frames else ""),
      "reference": r.reference_caption,
      "questions": questions[:MAX_QUESTIONS],
      "questions_total": len(questions),
    }
  return out
