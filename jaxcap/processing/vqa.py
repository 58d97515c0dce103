"""Multiple-choice VQA with the image: the one prompt / target format that SFT trains (`sft.vqa_fraction`) and the
VQA probe (`jaxcap.eval.vqa`) scores, so the probe measures the skill SFT taught.

Prompt (the user turn's text, after the image):

    What colour is the star on the right?
    A. green
    B. yellow
    C. blue
    Answer with the option's letter from the given choices.

Target (the assistant turn): the correct letter, a full stop and the option's text, e.g. "A. green". The probe
scores each option's whole answer ("A. green" and the end of the turn) by its likelihood, so a policy that says
the right text is credited even where its letter is unreliable (the tiny embedded student learns the texts well
and the letters at chance). `letter_token_ids` checks that letters are single tokens that start a target.
"""

from __future__ import annotations

from typing import Sequence

from jaxcap.data.records import MultipleChoiceQuestion

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
INSTRUCTION = "Answer with the option's letter from the given choices."


def _check_count(q: MultipleChoiceQuestion) -> None:
  if len(q.options) > len(LETTERS):
    raise ValueError(f"question {q.id!r} has {len(q.options)} options; VQA letters them A..Z (at most 26).")


def vqa_prompt(q: MultipleChoiceQuestion) -> str:
  """The question, its options lettered in their given order ("A. ...", one per line), and the instruction."""
  _check_count(q)
  return "\n".join([q.question, *(f"{LETTERS[i]}. {o}" for i, o in enumerate(q.options)), INSTRUCTION])


def vqa_target(q: MultipleChoiceQuestion) -> str:
  """The correct letter followed by the option's text: "B. red"."""
  return option_answer(q, q.answer_index)


def option_answer(q: MultipleChoiceQuestion, k: int) -> str:
  """The answer that picks option `k`: its letter and its text, "B. red" (what the probe scores for option k)."""
  _check_count(q)
  return f"{LETTERS[k]}. {q.options[k]}"


def letter_token_ids(tokenizer, count: int) -> list[int]:
  """Token ids [count] of the letters A.. (`count` letters): each letter must be one token of its own, distinct
  from the others and from the unknown token, and a target ("A. ...") must start with it; raises ValueError
  naming the letter otherwise (the probe could not read the policy's answer from one next-token distribution)."""
  if not 1 <= count <= len(LETTERS):
    raise ValueError(f"{count} options: VQA letters 1..{len(LETTERS)} options.")
  encode = lambda text: list(tokenizer(text, add_special_tokens=False)["input_ids"])
  unk = getattr(tokenizer, "unk_token_id", None)
  ids = []
  for letter in LETTERS[:count]:
    alone = encode(letter)
    if len(alone) != 1 or (unk is not None and alone[0] == unk):
      raise ValueError(
        f"the tokenizer encodes the option letter {letter!r} as {alone} (want one known token); the VQA probe "
        "scores an answer by the next-token logits of the option letters, so each must be a single token."
      )
    lead = encode(f"{letter}. x")[:1]
    if lead != alone:
      raise ValueError(
        f"the tokenizer starts the VQA target {letter + '. x'!r} with token {lead} instead of the letter's "
        f"{alone}; the letter would not be the first answer token the probe reads."
      )
    ids.append(alone[0])
  if len(set(ids)) != len(ids):
    raise ValueError(f"the option letters {list(LETTERS[:count])} share token ids {ids}; each needs its own token.")
  return ids


def max_options(questions: Sequence[MultipleChoiceQuestion]) -> int:
  """The largest option count of `questions` (0 for none)."""
  return max((len(q.options) for q in questions), default=0)
