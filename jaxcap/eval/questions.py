"""Asking a text-only judge multiple-choice questions about captions (shared by Prism and CaptionQA).

Option order is seeded by (seed, image id, question id) only, so every captioner is asked the very same
lettered question: differences between captioners are never option-order luck.
"""

from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np

from jaxcap.rewards.caprl import parse_choice
from jaxcap.data.records import MultipleChoiceQuestion


def option_order(seed: int, image_id: str, question_id: str, num_options: int, shuffle: bool = True) -> np.ndarray:
  """A permutation of range(num_options), stable across processes and captioners."""
  if not shuffle:
    return np.arange(num_options)
  digest = hashlib.blake2b(f"{seed}\x1f{image_id}\x1f{question_id}".encode(), digest_size=8).digest()
  return np.random.default_rng(int.from_bytes(digest, "little")).permutation(num_options)


def presented_options(question: MultipleChoiceQuestion, order: np.ndarray) -> tuple[tuple[str, ...], int]:
  """(options in presented order, index of the gold option among them)."""
  options = tuple(question.options[i] for i in order)
  return options, options.index(question.answer)


def is_yes_no(question: MultipleChoiceQuestion) -> bool:
  return sorted(o.strip().lower() for o in question.options) == ["no", "yes"]


def chosen_index(reply: str, options: Sequence[str]) -> int | None:
  """Index of the option a reply picks (a letter, "The answer is B", or the option text); None if none."""
  return parse_choice(reply, options, "exact")


def truncate_words(caption: str, limit: int | None) -> str:
  """The first `limit` whitespace words of a caption (None: unchanged)."""
  if limit is None:
    return caption
  words = caption.split()
  return caption if len(words) <= limit else " ".join(words[:limit])
