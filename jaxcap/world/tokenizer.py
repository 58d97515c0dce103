"""A byte-level BPE tokenizer for the tiny student, trained on the world's text and saved as an HF
`tokenizer.json` carrying the Qwen2.5-VL chat and vision special tokens, so the tiny student goes through
the same tokenisation code path as a real Qwen2.5-VL checkpoint."""

from __future__ import annotations

import os
import pathlib
from typing import Iterable

import numpy as np

from jaxcap.world.captions import reference_caption, student_caption, teacher_captions
from jaxcap.world.questions import generate_questions
from jaxcap.world.scene import WorldConfig, sample_scene

QWEN2_5_VL_SPECIAL_TOKENS = (
  "<|endoftext|>",
  "<|im_start|>",
  "<|im_end|>",
  "<|object_ref_start|>",
  "<|object_ref_end|>",
  "<|box_start|>",
  "<|box_end|>",
  "<|quad_start|>",
  "<|quad_end|>",
  "<|vision_start|>",
  "<|vision_end|>",
  "<|vision_pad|>",
  "<|image_pad|>",
  "<|video_pad|>",
)


def world_corpus(num_scenes: int = 300, seed: int = 0) -> Iterable[str]:
  """Captions and questions of `num_scenes` scenes (half clips), plus chat-template words."""
  yield "system user assistant You are a helpful assistant. Describe this image in detail."
  for i in range(num_scenes):
    rng = np.random.default_rng([seed, i])
    scene = sample_scene(rng, f"t{i}", WorldConfig(), clip=i % 2 == 1)
    yield reference_caption(scene)
    yield student_caption(scene, rng)
    yield from teacher_captions(scene, rng).values()
    yield from (q.question + " " + " ".join(q.options) for q in generate_questions(scene, rng))


def train_world_tokenizer(out_dir: str | os.PathLike, vocab_size: int = 1024, seed: int = 0) -> pathlib.Path:
  """Trains and writes `<out_dir>/tokenizer.json`; returns its path. Special tokens get the first ids."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

  tokenizer = Tokenizer(models.BPE())
  tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tokenizer.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
    vocab_size=vocab_size,
    special_tokens=list(QWEN2_5_VL_SPECIAL_TOKENS),
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    show_progress=False,
  )
  tokenizer.train_from_iterator(world_corpus(seed=seed), trainer=trainer)
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  path = out / "tokenizer.json"
  tokenizer.save(str(path))
  return path
