"""Judges: the batched judge protocol, its deterministic rule-based implementation, and LLM judges over any
OpenAI-compatible server (HttpJudge on a JudgeFleet)."""

from jaxcap.judges.protocol import Judge, JudgeResult
from jaxcap.judges.rule_based import RuleBasedJudge

__all__ = ["Judge", "JudgeResult", "RuleBasedJudge"]
