"""Evaluation of captioners by the papers' protocols (Prism, CaptionQA, DCScore, CapArena, b-CapScore) and a
reward-hacking red team, through the judge protocol only; `python -m jaxcap.eval` writes the report.
"""

from jaxcap.eval.bcapscore import b_capscore
from jaxcap.eval.caparena import CapArenaConfig, battle_outcome, run_caparena
from jaxcap.eval.captioners import CaptionSet, captions_from_fn, load_captioner, read_caption_jsonl, write_caption_jsonl
from jaxcap.eval.captionqa import CaptionQAConfig, question_score, run_captionqa
from jaxcap.eval.dcscore import DCScoreConfig, run_dcscore
from jaxcap.eval.evaluate import EvalConfig, evaluate
from jaxcap.eval.metrics import RatioMetric, bootstrap_estimates
from jaxcap.eval.prism import PrismConfig, run_prism
from jaxcap.eval.redteam import RedTeamConfig, make_attacks, run_redteam
from jaxcap.eval.render import write_report
from jaxcap.eval.report import EvalReport

__all__ = [
  "CapArenaConfig", "CaptionQAConfig", "CaptionSet", "DCScoreConfig", "EvalConfig", "EvalReport", "PrismConfig",
  "RatioMetric", "RedTeamConfig", "b_capscore", "battle_outcome", "bootstrap_estimates", "captions_from_fn",
  "evaluate", "load_captioner", "make_attacks", "question_score", "read_caption_jsonl", "run_caparena",
  "run_captionqa", "run_dcscore", "run_prism", "run_redteam", "write_caption_jsonl", "write_report",
]  # fmt: skip
