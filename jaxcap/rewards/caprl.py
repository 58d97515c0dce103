"""CapRL: a caption's reward is how well a text-only judge answers the image's questions from it.

R(c) = scale * (1/N) * sum_k r_k with r_k = 1 if the judge's chosen option is the gold one, for N questions
drawn from the image's M, options shuffled on every draw. Presets (`preset` option):
  paper          N = 4 without replacement, shuffled, the reply's letter or option text, scale 1
  released_code  8 draws with replacement, shuffled, a last option "Can not answer based on the caption", the
                 first letter A-I of the reply, scale 2 (the CapRL reward server as the paper's runs used it)
  caprl          CapRL's released launcher: as released_code, but options in the data's order and no
                 cannot-answer option (the launcher does not pass --shuffle_qa)
  caprl_plus     CapRL++'s released server: 8 draws with replacement, shuffled, the cannot-answer option always
                 labelled F (A-D then F for four options), first letter A-I, scale 1 (accuracy as is)
How the answerer is asked (template, sampling, a reply with no letter) is the judge's: judge.answerer.
"""

from __future__ import annotations

import collections
import dataclasses
import re
from typing import Sequence

import numpy as np

from jaxcap.judges.protocol import Judge, MultipleChoiceRequest, option_labels
from jaxcap.rewards.batch import RewardBatch, make_batch
from jaxcap.data.records import ImageRecord, align_records
from jaxcap.rewards.families import reward_family

LETTERS = "ABCDEFGHI"
RELEASED_CANNOT_ANSWER = "Can not answer based on the caption"
_PREFILL_RE = re.compile(r"^\s*(?:the\s+)?answer\s*(?:is)?\s*[:\-]?\s*", re.I)


@dataclasses.dataclass(frozen=True)
class CapRLConfig:
  questions_per_caption: int = 4  # N; the paper's best (N=4: 48.4 vs N=8: 48.3)
  with_replacement: bool = False  # released code draws with replacement
  shuffle_options: bool = True
  cannot_answer_option: str | None = None  # appended last after shuffling when set
  cannot_answer_label: str = ""  # its letter ('' = the next after the options; CapRL++ released: always 'F')
  answer_parsing: str = "exact"  # "exact": reply is the letter or the option text; "first_letter": first A-I
  reward_scale: float = 1.0  # released code: 2.0
  min_answered_fraction: float = 0.5  # below this share of non-failed answers the reward is masked
  seed: int = 0
  name: str = "caprl/accuracy"

  def __post_init__(self):
    if self.answer_parsing not in ("exact", "first_letter"):
      raise ValueError(f"CapRLConfig.answer_parsing={self.answer_parsing!r}: use 'exact' or 'first_letter'.")
    if self.questions_per_caption < 1:
      raise ValueError(f"CapRLConfig.questions_per_caption={self.questions_per_caption}: must be >= 1.")
    if self.cannot_answer_label and (len(self.cannot_answer_label) != 1 or self.cannot_answer_label not in LETTERS):
      raise ValueError(f"CapRLConfig.cannot_answer_label={self.cannot_answer_label!r}: one letter A-I, or ''.")

  @classmethod
  def paper(cls, **overrides) -> "CapRLConfig":
    return cls(**overrides)

  @classmethod
  def released_code(cls, **overrides) -> "CapRLConfig":
    base = dict(
      questions_per_caption=8,
      with_replacement=True,
      cannot_answer_option=RELEASED_CANNOT_ANSWER,
      answer_parsing="first_letter",
      reward_scale=2.0,
    )
    return cls(**(base | overrides))

  @classmethod
  def caprl(cls, **overrides) -> "CapRLConfig":
    return cls.released_code(**(dict(shuffle_options=False, cannot_answer_option=None) | overrides))

  @classmethod
  def caprl_plus(cls, **overrides) -> "CapRLConfig":
    return cls.released_code(**(dict(reward_scale=1.0, cannot_answer_label="F") | overrides))


PRESETS = ("paper", "released_code", "caprl", "caprl_plus")


def parse_choice(reply: str, options: Sequence[str], mode: str, labels: Sequence[str] = ()) -> int | None:
  """Index of the option a judge reply picks (by its label: `labels`, or A, B, C, ... by position), or None when it
  picks none (scored as wrong, not failed)."""
  labels = option_labels(len(options), labels)
  if mode == "first_letter":
    for ch in reply:
      if ch in LETTERS[:9]:
        return labels.index(ch) if ch in labels else None
    return None
  text = _PREFILL_RE.sub("", reply).strip().strip(".:)( ").strip()
  if len(text) == 1 and text in labels:
    return labels.index(text)
  lowered = [o.strip().lower() for o in options]
  return lowered.index(text.lower()) if text.lower() in lowered else None


class CapRLReward:
  """Callable reward; see module docstring. `judge` only needs `answer_multiple_choice`."""

  def __init__(self, judge: Judge, config: CapRLConfig = CapRLConfig()):
    self.judge = judge
    self.config = config
    self.names = (config.name,)

  def draw(self, record: ImageRecord, rng: np.random.Generator) -> list[tuple[str, tuple[str, ...], int]]:
    """(question, presented options, gold index) for each draw; the options are shuffled per draw (their
    letters: `labels`)."""
    cfg, questions = self.config, record.questions
    if not questions:
      return []
    if cfg.with_replacement:
      picks = rng.integers(len(questions), size=cfg.questions_per_caption)
    else:
      picks = rng.permutation(len(questions))[: cfg.questions_per_caption]
    out = []
    for p in picks:
      q = questions[int(p)]
      order = rng.permutation(len(q.options)) if cfg.shuffle_options else np.arange(len(q.options))
      options = tuple(q.options[i] for i in order)
      if cfg.cannot_answer_option:
        options += (cfg.cannot_answer_option,)
      out.append((q.question, options, options.index(q.answer)))
    return out

  def labels(self, options: Sequence[str]) -> tuple[str, ...]:
    """The letter of each presented option: A, B, C, ...; the cannot-answer option's own label when it is set."""
    labels = option_labels(len(options))
    if self.config.cannot_answer_option and self.config.cannot_answer_label:
      labels = labels[:-1] + (self.config.cannot_answer_label,)
    return labels

  def __call__(
    self, captions: Sequence[str], records: Sequence[ImageRecord], *, step: int = 0, first: int = 0
  ) -> RewardBatch:
    """Reward [N, 1]; masked where the image has no questions or too many answers failed. `first`: the index of
    captions[0] in the step's batch, which keys the question draws."""
    records = align_records(captions, records)
    requests, owners, golds = [], [], []
    for i, (caption, record) in enumerate(zip(captions, records)):
      # One generator per (seed, step, caption index in the step's batch): draws don't depend on the rest of the
      # batch, nor on whether it is judged whole or by groups (`first` > 0: streaming judging)
      rng = np.random.default_rng([self.config.seed, step, first + i])
      media = "video" if record.is_video else "image"
      for question, options, gold in self.draw(record, rng):
        requests.append(MultipleChoiceRequest(record.id, caption, question, options, self.labels(options), media))
        owners.append(i)
        golds.append(gold)
    replies = self.judge.answer_multiple_choice(requests) if requests else []
    correct = np.zeros(len(captions))
    answered = np.zeros(len(captions))
    drawn = np.zeros(len(captions))
    failed = collections.Counter()
    # evidence: each question with its options as presented and their letters, the gold letter, the letter chosen
    # and whether it was right (the inspector shows each letter's option text)
    asked: list[list[dict]] = [[] for _ in captions]
    for req, owner, gold, reply in zip(requests, owners, golds, replies):
      drawn[owner] += 1
      labels = req.option_labels()
      seen = {"question": req.question, "options": list(req.options), "labels": list(labels), "gold": labels[gold]}
      asked[owner].append(seen)
      if reply.failed:
        failed["answer_multiple_choice"] += 1
        seen["failed"] = True
        continue
      answered[owner] += 1
      choice = parse_choice(reply.reply, req.options, self.config.answer_parsing, labels)
      correct[owner] += choice == gold
      seen.update(letter=None if choice is None else labels[choice], correct=choice == gold)
    valid = (answered > 0) & (answered >= self.config.min_answered_fraction * drawn)
    accuracy = np.divide(correct, answered, out=np.zeros_like(correct), where=answered > 0)
    return make_batch(
      self.names,
      (self.config.reward_scale * accuracy)[:, None],
      valid[:, None],
      [1.0],
      captions,
      records,
      failed,
      evidence=[{self.names[0]: {"questions": a}} for a in asked],
    )


@reward_family("caprl", options=CapRLConfig, extra_options=("preset",))
def caprl_reward(judge: Judge, *, preset: str = "paper", **options) -> CapRLReward:
  """CapRL; `preset` (module docstring) sets the defaults the other options override."""
  if preset not in PRESETS:
    raise ValueError(f"reward.caprl.preset={preset!r}: use one of {', '.join(PRESETS)}.")
  return CapRLReward(judge, getattr(CapRLConfig, preset)(**options))
