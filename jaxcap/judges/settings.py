"""The judge's settings: the run config's `judge` block, declared once (its fields, defaults, validation and
resume policy) and used as is by the trainer, the evaluation and the judge CLIs."""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxcap.fields import ALLOWED, Block, field
from jaxcap.judges.answerer import Answerer
from jaxcap.judges.factory import JUDGE_KINDS
from jaxcap.judges.fleet import STRUCTURED_OUTPUT_MODES


@dataclasses.dataclass(frozen=True)
class JudgeConfig(Block):
  """The judge (jaxcap.judges.factory): rule_based, http (an OpenAI-compatible fleet), factory, or none (rewards
  that need no judge)."""

  kind: str = field("rule_based", "the judge kind", choices=JUDGE_KINDS)
  failure_rate: float = field(0.0, "rule_based: share of judgments that fail (to exercise masking)", ge=0, le=1)
  seed: int = field(0, "rule_based: its failure draws (the trainer passes the run's seed)")
  endpoints: str = field("", "http: comma-separated base URLs, e.g. http://judge0:8000/v1", resume=ALLOWED)
  model: str = field("", "http: the served model's name")
  api_key_env: str = field("JUDGE_API_KEY", "http: the variable holding the servers' key; '' = no auth", resume=ALLOWED)
  timeout_s: float = field(60.0, "http: seconds per request", gt=0, resume=ALLOWED)
  max_concurrency: int = field(64, "http: requests in flight", ge=1, resume=ALLOWED)
  fleet_config: str = field("", "http: JSON file, role -> RoleConfig fields (instead of endpoints / model)")
  send_images: bool = field(False, "http: send the image along with the caption")
  structured_output: str = field("json_schema", "http: how replies are constrained", choices=STRUCTURED_OUTPUT_MODES)
  prompt_dir: str = field("", "http: a folder of *.jinja templates read before the shipped ones ('' = shipped only)")
  answerer: Answerer = field(Answerer(), "http: how CapRL's answerer is asked")
  factory: str = field("", "factory: 'package.module:function' returning a Judge, called with options")
  options: dict[str, Any] = field({}, "factory: keyword arguments of the factory")
  # every endpoint of every role answers one real judgment before any compute (jaxcap.judges.preflight); the
  # preflight and the failure budget stop a run, they do not change what it trains
  preflight: bool = field(True, "check every endpoint before any compute", resume=ALLOWED)
  # jaxcap.rewards.budget: stop when the share of valid judgments in an RL step is below min_valid_fraction for
  # failure_patience consecutive steps
  min_valid_fraction: float = field(0.5, "the failure budget's share of valid judgments", ge=0, le=1, resume=ALLOWED)
  failure_patience: int = field(3, "steps below the budget before the run stops", ge=0, hint="0 = off", resume=ALLOWED)
