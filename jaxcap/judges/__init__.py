"""Judges: the batched judge protocol and LLM judges over any OpenAI-compatible server (HttpJudge on a
JudgeFleet), with their factory, preflight check and HTTP server. The synthetic world's rule-based judge is
`jaxcap.world.judge.RuleBasedJudge` (registered as judge.kind='rule_based' when `jaxcap.world` is imported)."""

from jaxcap.judges.protocol import Judge, JudgeResult

__all__ = ["Judge", "JudgeResult"]
