"""What a workdir holds, read into one JSON-able document for the page. Every file is optional and read as it is
now (a run in progress has a metrics.jsonl whose last line may be half written, and no RL-end captions yet):

    metrics.jsonl            -> curves: {phase: {key: [[step, value], ...]}} (finite numbers only; the step is
                                the phase's own, from 1, as metrics.jsonl counts it)
    rollouts/step_*.jsonl    -> steps: [{step, groups}] (jaxcap.train.logs.rollout_records), captions flagged,
                                groups marked when they carry no signal or their captions saw different questions
    captions/<phase>_<tag>.jsonl -> held-out: per image, the SFT-end caption beside the RL-end one, with scores
    **/report.json (jaxcap.eval) -> evals (jaxcap.inspect.evals)

Beside each image: its reference caption and curated questions (jaxcap.inspect.truth).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from jaxcap.inspect.evals import eval_reports
from jaxcap.inspect.flags import caption_flags
from jaxcap.inspect.jsonl import json_lines
from jaxcap.inspect.media import Thumbnails
from jaxcap.inspect.truth import TruthIndex
from jaxcap.train.logs.rollout_records import FILE_RE

# The held-out caption sets the comparison view pairs, in order of preference for each side.
BEFORE = ("sft_end", "rl_start", "sft_start")
AFTER = ("rl_end",)
# Advantages below this are float noise: a group whose captions all have one carries no signal.
NO_SIGNAL = 1e-6


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


def _own_questions(samples: list[dict]) -> dict[str, int]:
  """family -> questions per caption, for each family whose captions were asked different questions (CapRL draws
  each caption's own sample of the image's questions): their rewards are not on the same questions."""
  out = {}
  evidence = [s.get("evidence") or {} for s in samples]
  families = {f for e in evidence for f, v in e.items() if isinstance(v, dict) and "questions" in v}
  for family in sorted(families):
    asked = [(e.get(family) or {}).get("questions") or [] for e in evidence]
    keys = {tuple(q.get("question", "") if isinstance(q, dict) else str(q) for q in a) for a in asked}
    if len(keys) > 1:
      out[family] = max(len(a) for a in asked)
  return out


def annotate_group(group: dict, thumbs: Thumbnails, truth: TruthIndex) -> dict:
  """A rollout record group as the page shows it: its image, reference caption and questions, its captions'
  flags, its reward spread (max - min, None with fewer than 2 judged captions), whether it carries no signal
  (every advantage 0: all its captions scored the same) and which families asked each caption its own questions."""
  known = truth.lookup("train", str(group.get("record_id", "")))
  group["thumb"] = thumbs.url(group.get("media", "") or known.get("media", ""))
  group["reference"] = group.get("reference") or known.get("reference", "")
  group["truth"] = known.get("questions", [])
  samples = group.get("samples", [])
  for s in samples:
    s["flags"] = caption_flags(s.get("caption", ""))
  rewards = [s["reward"] for s in samples if _number(s.get("reward"))]
  group["spread"] = max(rewards) - min(rewards) if len(rewards) > 1 else None
  advantages = [s["advantage"] for s in samples if _number(s.get("advantage"))]
  group["no_signal"] = bool(advantages) and all(abs(a) < NO_SIGNAL for a in advantages)
  group["own_questions"] = _own_questions(samples)
  return group


def rollout_steps(workdir: Path, thumbs: Thumbnails, truth: TruthIndex) -> list[dict]:
  directory = workdir / "rollouts"
  files = sorted(directory.glob("step_*.jsonl")) if directory.is_dir() else []
  steps = []
  for path in files:
    m = FILE_RE.match(path.name)
    if m:
      steps.append({"step": int(m.group(1)), "groups": [annotate_group(g, thumbs, truth) for g in json_lines(path)]})
  return steps


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


def heldout(workdir: Path, thumbs: Thumbnails, truth: TruthIndex) -> dict:
  """The comparison of the SFT-end (or RL-start) captions with the RL-end ones, one pair per image, each with its
  image's reference caption and questions and the change in QA accuracy (`delta`: RL end minus SFT end, None
  until both are scored); a side whose file is not written yet (a run in progress) is null."""
  sets = _caption_sets(workdir)
  before = next((n for n in BEFORE if n in sets), None)
  after = next((n for n in AFTER if n in sets), None)
  ids = list(dict.fromkeys([*sets.get(before, {}), *sets.get(after, {})]))
  rows = []
  for i in ids:
    left, right = _side(sets.get(before, {}).get(i)), _side(sets.get(after, {}).get(i))
    known = truth.lookup("heldout", i)
    scores = [side.get("qa_accuracy") if side else None for side in (left, right)]
    delta = scores[1] - scores[0] if all(_number(v) for v in scores) else None
    rows.append({"id": i, "thumb": thumbs.url(known.get("media", "")), "reference": known.get("reference", ""),
                 "truth": known.get("questions", []), "left": left, "right": right, "delta": delta})  # fmt: skip
  return {"sets": sorted(sets), "left": before, "right": after, "rows": rows}


def load_run(workdir: Path, site: Path, eval_reports_extra: list[Path] = ()) -> dict[str, Any]:
  """The page's document for `workdir`, thumbnails written under `site`/media."""
  workdir = Path(workdir).resolve()
  saved = json.loads((workdir / "config.json").read_text()) if (workdir / "config.json").exists() else {}
  config = saved.get("config", saved)  # jaxcap.train.shell.resume.record's {"config": ..., "runtime": ...}
  thumbs = Thumbnails(site, [workdir, Path.cwd()])
  truth = TruthIndex(workdir, config)
  summary = json.loads((workdir / "summary.json").read_text()) if (workdir / "summary.json").exists() else None
  return {
    "run": {
      "name": config.get("name", workdir.name),
      "workdir": str(workdir),
      "finished": summary is not None,
      "summary": {k: v for k, v in (summary or {}).items() if isinstance(v, dict) and not k.endswith("_samples")},
    },
    "curves": curves(workdir),
    "steps": rollout_steps(workdir, thumbs, truth),
    "heldout": heldout(workdir, thumbs, truth),
    "evals": eval_reports(workdir, thumbs, truth, list(eval_reports_extra)),
  }
