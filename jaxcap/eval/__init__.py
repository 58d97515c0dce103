"""Evaluation of captioners by the papers' protocols (Prism, CaptionQA, DCScore, CapArena, b-CapScore) and a
reward-hacking red team, through the judge protocol only; `python -m jaxcap.eval` writes the report.

Names are imported lazily so that `python -m jaxcap.eval` does not import every suite twice.
"""

import importlib

_EXPORTS = {
  "CaptionSet": "captioners",
  "read_caption_jsonl": "captioners",
  "write_caption_jsonl": "captioners",
  "captions_from_fn": "captioners",
  "load_captioner": "captioners",
  "PrismConfig": "prism",
  "run_prism": "prism",
  "CaptionQAConfig": "captionqa",
  "run_captionqa": "captionqa",
  "question_score": "captionqa",
  "DCScoreConfig": "dcscore",
  "run_dcscore": "dcscore",
  "CapArenaConfig": "caparena",
  "run_caparena": "caparena",
  "battle_outcome": "caparena",
  "b_capscore": "bcapscore",
  "RedTeamConfig": "redteam",
  "run_redteam": "redteam",
  "make_attacks": "redteam",
  "EvalConfig": "evaluate",
  "evaluate": "evaluate",
  "EvalReport": "report",
  "write_report": "report",
  "bootstrap_estimates": "metrics",
  "RatioMetric": "metrics",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
  if name not in _EXPORTS:
    raise AttributeError(f"module 'jaxcap.eval' has no attribute {name!r}")
  return getattr(importlib.import_module(f"jaxcap.eval.{_EXPORTS[name]}"), name)
