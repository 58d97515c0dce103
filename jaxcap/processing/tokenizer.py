"""Encoding data as text (`encode_text`, `text_only_tokenizer`), and a small word-level tokenizer with Qwen2.5-VL's
special tokens for tiny models and the synthetic world.

Strings that come from data (captions, references, questions, options, criteria, command-line prompts) are
encoded with special-token parsing off, so "<|im_end|>" in a web-scraped caption is those characters, never the
end-of-turn token; only the chat template (`jaxcap.processing.prompt`) inserts control tokens, by id.

Real checkpoints bring their own tokenizer; `word_tokenizer` lets tests and the embedded default run with no
downloads.
"""

from __future__ import annotations

import copy
from typing import Any, Sequence

import numpy as np

from jaxcap.models.config import Qwen25VLConfig

SPECIAL_TOKENS = (
  "<|endoftext|>",
  "<|im_start|>",
  "<|im_end|>",
  "<|vision_start|>",
  "<|vision_end|>",
  "<|image_pad|>",
  "<|video_pad|>",
)


def encode_text(tokenizer: Any, text: str) -> list[int]:
  """Token ids of `text` read as plain characters: no special token is parsed (`split_special_tokens=True`, which
  transformers' fast and slow tokenizers both honour) and none is added."""
  return list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])


def text_only_tokenizer(tokenizer: Any) -> Any:
  """A copy of `tokenizer` whose calls parse no special tokens unless a caller asks (`split_special_tokens` on by
  default), so every `tokenizer(text)` on data encodes the characters. The original is left as it is (it may
  serve a chat template elsewhere); decoding is unchanged."""
  if getattr(tokenizer, "split_special_tokens", None) is True:
    return tokenizer
  out = copy.deepcopy(tokenizer)  # deep: a fast tokenizer's backend carries the setting per call
  out.split_special_tokens = True
  return out


def special_token_ids(cfg: Qwen25VLConfig) -> dict[str, int]:
  """Where the config expects each special token (the tiny presets put them at the top of the vocabulary).
  `<|im_start|>`, which the config does not name, takes the free id nearest below `<|im_end|>` (then above): two
  tokens on one id would decode by whichever the tokenizer's hash map lists first, which differs between
  processes."""
  ids = {
    "<|endoftext|>": cfg.bos_token_id,
    "<|im_end|>": cfg.eos_token_id,
    "<|vision_start|>": cfg.vision_start_token_id,
    "<|vision_end|>": cfg.vision_end_token_id,
    "<|image_pad|>": cfg.image_token_id,
    "<|video_pad|>": cfg.video_token_id,
  }
  taken, eos = set(ids.values()), cfg.eos_token_id
  near = (i for d in range(1, cfg.text.vocab_size) for i in (eos - d, eos + d) if 0 <= i < cfg.text.vocab_size)
  return {**ids, "<|im_start|>": next(i for i in near if i not in taken)}


def word_tokenizer(words: Sequence[str], cfg: Qwen25VLConfig):
  """A `PreTrainedTokenizerFast` splitting on whitespace and punctuation, with `words` as its vocabulary
  (unknown words map to <unk>) and the special tokens at the ids `cfg` expects."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast

  special = special_token_ids(cfg)
  vocab: dict[str, int] = {}
  taken = set(special.values())
  next_id = 0

  def add(tok):
    nonlocal next_id
    while next_id in taken:
      next_id += 1
    vocab[tok] = next_id
    taken.add(next_id)

  for tok in ["<unk>", "\n", *dict.fromkeys(words)]:
    if tok not in vocab and tok not in special:
      add(tok)
  vocab.update(special)
  if max(vocab.values()) >= cfg.text.vocab_size:
    raise ValueError(f"{len(vocab)} tokens do not fit a vocabulary of {cfg.text.vocab_size}")
  tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.Sequence(
    [pre_tokenizers.Split("\n", "isolated"), pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation("isolated")]
  )
  tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
  fast = PreTrainedTokenizerFast(
    tokenizer_object=tok,
    unk_token="<unk>",
    pad_token="<|endoftext|>",
    eos_token="<|im_end|>",
    additional_special_tokens=list(SPECIAL_TOKENS[1:]),
  )
  return fast


def encode_targets(tokenizer: Any, captions: Sequence[str], length: int, eos_id: int) -> tuple[np.ndarray, np.ndarray]:
  """Target token ids int32 [N, length] (each caption + EOS, truncated) and their mask bool [N, length]."""
  ids = np.zeros((len(captions), length), np.int32)
  mask = np.zeros((len(captions), length), bool)
  for i, c in enumerate(captions):
    t = encode_text(tokenizer, c)[: length - 1] + [eos_id]
    ids[i, : len(t)] = t
    mask[i, : len(t)] = True
  return ids, mask
