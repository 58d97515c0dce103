"""The Qwen chat templates as pieces: ChatML turns with vision markers, and how each family expands one image or
video placeholder (Qwen3-VL: a `<t seconds>` timestamp and its own vision block per temporal patch).

Pieces are (text, is_control): control pieces are the template's special tokens (inserted by id), every other
piece (roles, the system prompt, message texts, timestamps) is text, whatever characters it holds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np

IMAGE_PAD, VIDEO_PAD = "<|image_pad|>", "<|video_pad|>"
VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
CONTROL_TOKENS = (IM_START, IM_END, VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)
DEFAULT_SYSTEM = "You are a helpful assistant."  # Qwen2.5-VL's template, when a conversation has no system turn
PROMPT_SETTINGS = "jaxcap_prompt.json"

Pieces = list[tuple[str, bool]]


class _TemplateDefault:
  """The system turn the family's own chat template adds (`Family.default_system`)."""

  def __repr__(self) -> str:
    return "TEMPLATE_DEFAULT"


TEMPLATE_DEFAULT = _TemplateDefault()


def read_prompt_settings(directory) -> dict:
  """The prompt settings a jaxcap export saved ({"system": str | None}); {} for other checkpoints."""
  path = Path(directory) / PROMPT_SETTINGS
  return json.loads(path.read_text()) if path.exists() else {}


def chat_pieces(
  messages: Sequence[dict], add_generation_prompt: bool = True, system: str | None = DEFAULT_SYSTEM
) -> Pieces:
  """The Qwen2.5-VL / Qwen3-VL chat template (ChatML with vision markers, one placeholder per image/video) as
  pieces. The two templates differ only in the system turn added when the conversation has none (`system`:
  Qwen2.5-VL's "You are a helpful assistant.", Qwen3-VL's none; `Family.default_system`)."""
  out: Pieces = []
  turn = lambda role, parts: [(IM_START, True), (f"{role}\n", False), *parts, (IM_END, True), ("\n", False)]
  if system is not None and (not messages or messages[0]["role"] != "system"):
    out += turn("system", [(system, False)])
  for msg in messages:
    content = msg["content"]
    if isinstance(content, str):
      content = [{"type": "text", "text": content}]
    parts = []
    for item in content:
      kind = item.get("type")
      if kind == "text":
        parts.append((item["text"], False))
      elif kind in ("image", "video"):
        parts += [(VISION_START, True), (IMAGE_PAD if kind == "image" else VIDEO_PAD, True), (VISION_END, True)]
      else:
        raise ValueError(f"message content item of type {kind!r}; use 'text', 'image' or 'video'")
    out += turn(msg["role"], parts)
  if add_generation_prompt:
    out += [(IM_START, True), ("assistant\n", False)]
  return out


def render_chat(
  messages: Sequence[dict], add_generation_prompt: bool = True, system: str | None = DEFAULT_SYSTEM
) -> str:
  """The chat template as one string (what transformers' processor is given; `Processor` tokenizes
  `chat_pieces` instead, so text that spells a control token stays text)."""
  return "".join(text for text, _ in chat_pieces(messages, add_generation_prompt, system))


def image_pieces(grid_thw, merge_size: int) -> Pieces:
  """What one <|image_pad|> becomes: one pad per merged patch (both families)."""
  return [(IMAGE_PAD, True)] * (int(np.prod(grid_thw)) // merge_size**2)


def video_pieces(grid_thw, merge_size: int, timestamps, temporal_patch_size: int) -> Pieces:
  """What one <|video_pad|> becomes in Qwen2.5-VL: one pad per merged patch (`timestamps` unused)."""
  return [(VIDEO_PAD, True)] * (int(np.prod(grid_thw)) // merge_size**2)


def group_timestamps(timestamps: Sequence[float], temporal_patch_size: int) -> list[float]:
  """Each temporal patch's time (seconds): the mean of its first and last frame's time, the last frame repeated to
  fill the final patch (transformers' `Qwen3VLProcessor._calculate_timestamps`, in float64 as there)."""
  ts = [float(t) for t in timestamps]
  if not ts:
    raise ValueError("a video needs at least one frame")
  ts += [ts[-1]] * (-len(ts) % temporal_patch_size)
  return [(ts[i] + ts[i + temporal_patch_size - 1]) / 2 for i in range(0, len(ts), temporal_patch_size)]


def timestamped_video_pieces(grid_thw, merge_size: int, timestamps, temporal_patch_size: int) -> Pieces:
  """What one <|video_pad|> becomes in Qwen3-VL (transformers' `Qwen3VLProcessor.replace_video_token`): per
  temporal patch, the text `<{t:.1f} seconds>` then <|vision_start|>, one pad per merged patch of the frame group,
  <|vision_end|>. Every frame group has its own vision markers, so the template's pair around the placeholder goes
  (`unwrap_videos`). `timestamps`: each sampled frame's time in the video (seconds)."""
  gt, gh, gw = (int(v) for v in grid_thw)
  times = group_timestamps(timestamps, temporal_patch_size)
  if len(times) != gt:
    raise ValueError(f"{len(times)} frame groups of timestamps for a video grid of {gt}; pass one time per frame")
  block = [(VISION_START, True), *[(VIDEO_PAD, True)] * (gh * gw // merge_size**2), (VISION_END, True)]
  out: Pieces = []
  for t in times:
    out += [(f"<{t:.1f} seconds>", False), *block]
  return out


def unwrap_videos(pieces: Pieces) -> Pieces:
  """`pieces` with each <|vision_start|> <|video_pad|> <|vision_end|> of the template collapsed to its
  <|video_pad|> (transformers' `Qwen3VLProcessor` since 5.25: one marker pair per frame group, none around them)."""
  wrapped = [(VISION_START, True), (VIDEO_PAD, True), (VISION_END, True)]
  out: Pieces = []
  i = 0
  while i < len(pieces):
    if pieces[i : i + 3] == wrapped:
      out.append(wrapped[1])
      i += 3
    else:
      out.append(pieces[i])
      i += 1
  return out
