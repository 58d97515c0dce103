"""The judge (declared in jaxcap.judges.settings) and RubiCap's rubrics."""

from __future__ import annotations

import dataclasses
from jaxcap.choices import RUBRIC_SOURCES
from jaxcap.fields import Block, field
from jaxcap.judges.settings import JudgeConfig as Judge  # noqa: F401  (the run config's judge block)


@dataclasses.dataclass(frozen=True)
class Rubrics(Block):
  """RubiCap rubrics (used only when reward.rubicap is set). 'policy': RubiCap's stage 1 at the start of RL against
  the captions of the policy being trained: committee consensus (>= min_agreement of the manifest's
  teacher_captions) minus what the student's greedy caption gets right, one criterion per failure; stored under
  workdir/rubrics, reused on resume. 'manifest': the rubrics the manifest rows carry (jaxcap.synthesize_rubrics)."""

  source: str = field(
    "policy",
    "where rubrics come from",
    choices=RUBRIC_SOURCES,
    rule="use 'policy' (synthesise against the policy) or 'manifest'",
  )
  min_agreement: int = field(3, "teachers that must agree on a fact", ge=1)
  batch_size: int = field(64, "images per rubric-synthesis batch", ge=1)
