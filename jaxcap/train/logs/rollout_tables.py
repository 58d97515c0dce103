"""Rollout record groups (jaxcap.train.logs.rollout_records) as the experiment trackers' tables: one row per
caption with its image, prompt, reference caption, rewards and what the judge said as readable text.

    columns, rows = rollout_table(groups)     # the "image" column holds the media path; a tracker swaps in its
                                              # own image type (wandb.Image) or an artifact path (MLflow)
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

LETTERS = "ABCDEFGHI"
COLUMNS = ("step", "record_id", "rank", "sample", "image", "prompt", "reference", "caption", "reward", "advantage",
           "tokens", "stop", "evidence")  # fmt: skip


def _mark(ok: Any) -> str:
  return "✓" if ok is True else "✗" if ok is False else "—"


def _question(q: Mapping) -> str:
  """`✗ What colour is it? answered A. red, gold B. black` (each letter with its option's text)."""
  options = list(q.get("options") or [])
  labels = list(q.get("labels") or LETTERS[: len(options)])
  text = lambda letter: options[labels.index(letter)] if letter in labels else "?"
  answered = (
    "judge failed" if q.get("failed") else (f"{q['letter']}. {text(q['letter'])}" if q.get("letter") else "none")
  )
  gold = f"{q['gold']}. {text(q['gold'])}" if q.get("gold") else "?"
  return f"{_mark(None if q.get('failed') else bool(q.get('correct')))} {q.get('question', '')} answered {answered}, gold {gold}"


def evidence_text(evidence: Mapping[str, Any]) -> str:
  """A caption's evidence (by reward family) as lines of text: CapRL's questions with the answered and the gold
  option, RubiCap's criteria with weight and verdict, BalCapRL's claims, reference units and language scores, the
  length mask's decision; any other family as its JSON."""
  lines = []
  for family, what in (evidence or {}).items():
    what = what if isinstance(what, Mapping) else {"value": what}
    lines.append(f"[{family}]")
    if isinstance(what.get("questions"), list):
      lines += [_question(q) for q in what["questions"] if isinstance(q, Mapping)]
    elif isinstance(what.get("criteria"), list):
      lines += [f"{_mark(c.get('passed'))} (weight {c.get('weight')}) {c.get('criterion')}" for c in what["criteria"]
                if isinstance(c, Mapping)]  # fmt: skip
    elif any(k in what for k in ("claims", "units", "language")):
      for c in what.get("claims") or []:
        if isinstance(c, Mapping):
          note = "" if c.get("pointable", True) else " (not pointable)"
          lines.append(f"{_mark(bool(c.get('correct') and c.get('pointable')))} claim: {c.get('claim')}{note}")
      lines += [
        f"{_mark(u.get('covered'))} unit: {u.get('unit')}" for u in what.get("units") or [] if isinstance(u, Mapping)
      ]
      if what.get("language"):
        lines.append("language: " + ", ".join(f"{k} {v}" for k, v in what["language"].items()))
    elif "in_band" in what:
      band = "in band" if what["in_band"] else f"outside the band: {', '.join(what.get('dims') or [])} set to 0"
      lines.append(f"{what.get('words')} words / {what.get('reference_words')} reference words: {band}")
    else:
      lines.append(json.dumps(what, default=str))
  return "\n".join(lines)


def rollout_table(groups: Sequence[Mapping]) -> tuple[list[str], list[list]]:
  """(columns, rows): COLUMNS then one column per reward dimension; one row per caption."""
  names = list(groups[0]["reward_names"]) if groups else []
  rows = []
  for group in groups:
    for j, s in enumerate(group["samples"]):
      rows.append(
        [group["step"], group["record_id"], group["rank"], j, group.get("media", ""), group.get("prompt", ""),
         group.get("reference", ""), s["caption"], s["reward"], s["advantage"], s["tokens"], s["stop"],
         evidence_text(s.get("evidence") or {}), *(s["rewards"].get(n) for n in names)]
      )  # fmt: skip
  return [*COLUMNS, *names], rows
