"""Judges: the batched judge protocol and its deterministic rule-based implementation."""

from jaxcap.judges.protocol import Judge, JudgeResult
from jaxcap.judges.rule_based import RuleBasedJudge

__all__ = ["Judge", "JudgeResult", "RuleBasedJudge"]
