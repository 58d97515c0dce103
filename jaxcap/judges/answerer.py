"""How CapRL's answerer is asked: the run config's `judge.answerer` block (read by `HttpJudge`)."""

from __future__ import annotations

import dataclasses

from jaxcap.choices import NO_LETTER_POLICIES
from jaxcap.fields import Block, field


@dataclasses.dataclass(frozen=True)
class Answerer(Block):
  """How CapRL's answerer (the `answerer` role of an http judge) is asked. Templates are names in the prompt
  directory (jaxcap/judges/prompts, or judge.prompt_dir first): a chat template, or a completion template (a raw
  prompt with the answer's start pre-filled, sent to /v1/completions) such as the released `caprl_released`."""

  template: str = field("caprl_answer", "the answerer's template for image captions")
  video_template: str = field("", "its template for video captions ('' = template)")
  temperature: float = field(0.0, "the answerer's sampling temperature", ge=0)
  max_tokens: int = field(512, "the most tokens of an answer", ge=1)
  # 'retry': re-asked (at judge-level retry temperature), then masked, never scored; 'wrong': the answer stands and
  # scores 0, as the released CapRL servers read a reply without a letter
  no_letter: str = field("retry", "an answer that names no option", choices=NO_LETTER_POLICIES)
