"""Prompt building: chat messages with images/videos -> padded token batch, vision patches and mRoPE positions."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from jaxcap.models.config import Qwen25VLConfig
from jaxcap.models.families import family_of_config, layout_for
from jaxcap.processing.chat import (
  CONTROL_TOKENS,
  IMAGE_PAD,
  PROMPT_SETTINGS,
  TEMPLATE_DEFAULT,
  VIDEO_PAD,
  chat_pieces,
  image_pieces,
  read_prompt_settings,
  unwrap_videos,
)
from jaxcap.processing.model_inputs import ModelInputs, pad_batch
from jaxcap.processing.rules import PROCESSOR_RULES
from jaxcap.processing.tokenizer import encode_text, text_only_tokenizer
from jaxcap.processing.video import VideoPreprocessConfig
from jaxcap.processing.video_frames import load_video, preprocess_video
from jaxcap.processing.vision import VisionPreprocessConfig, preprocess_image


class Processor:
  """Tokenizer + image/video preprocessing for a student family, equal to its HF processor's outputs
  (`Qwen2_5_VLProcessor`, `Qwen3VLProcessor`; the family of `cfg` picks the rules, `jaxcap.processing.rules`).

  `tokenizer` is any HF tokenizer with the Qwen special tokens (e.g. `AutoTokenizer.from_pretrained(ckpt_dir)`);
  `vision_cfg` / `video_cfg` are the image and video processor settings (`from_pretrained` reads them from the
  checkpoint; by default images get transformers' defaults for `cfg`'s geometry and video frames the family's
  video class defaults over the image geometry, for Qwen2.5-VL the image budget); `fps` is the rate assumed for
  videos given as frame lists without an 'fps' (default video_cfg.fps); `system` is the system prompt added when a
  conversation has none (None: no system turn; by default the family's template's, `Family.default_system`).
  """

  def __init__(
    self,
    tokenizer: Any,
    cfg: Qwen25VLConfig,
    vision_cfg: VisionPreprocessConfig | None = None,
    fps: float | None = None,
    system: Any = TEMPLATE_DEFAULT,
    video_cfg: VideoPreprocessConfig | None = None,
  ):
    family = family_of_config(cfg)
    self.rules = PROCESSOR_RULES[family.processor]
    # Everything that encodes with this tokenizer (targets, answers, lengths) encodes data: control tokens stay text.
    self.tokenizer, self.cfg = text_only_tokenizer(tokenizer), cfg
    self.system = family.default_system if system is TEMPLATE_DEFAULT else system
    self.vision_cfg = vision_cfg or VisionPreprocessConfig(
      patch_size=cfg.vision.patch_size,
      temporal_patch_size=cfg.vision.temporal_patch_size,
      merge_size=cfg.vision.spatial_merge_size,
      **family.preprocess,
    )
    self.video_cfg = video_cfg or self.rules.video_config.from_image(self.vision_cfg)
    self.fps = float(fps) if fps is not None else self.video_cfg.fps
    want = (cfg.vision.patch_size, cfg.vision.temporal_patch_size, cfg.vision.spatial_merge_size)
    for name, pc in (("image", self.vision_cfg), ("video", self.video_cfg)):
      got = (pc.patch_size, pc.temporal_patch_size, pc.merge_size)
      if got != want:
        raise ValueError(
          f"the {name} processor config has (patch_size, temporal_patch_size, merge_size) = {got} but the model's "
          f"vision config has {want}; use the processor configs that came with the checkpoint."
        )
    for token, want_id in ((IMAGE_PAD, cfg.image_token_id), (VIDEO_PAD, cfg.video_token_id)):
      got_id = tokenizer.convert_tokens_to_ids(token)
      if got_id != want_id:
        raise ValueError(
          f"tokenizer maps {token} to {got_id} but the model config expects {want_id}; "
          "load the tokenizer from the same checkpoint directory as the model."
        )

  @classmethod
  def from_pretrained(
    cls,
    directory,
    cfg: Qwen25VLConfig | None = None,
    vision_cfg: VisionPreprocessConfig | None = None,
    video_cfg: VideoPreprocessConfig | None = None,
    **kw,
  ) -> "Processor":
    """The processor of a checkpoint directory: its tokenizer, `config.json`, and image / video processor
    settings read as transformers reads them (`VisionPreprocessConfig.from_pretrained`, the family's video class
    `from_pretrained`) unless given."""
    from transformers import AutoTokenizer
    from jaxcap.checkpoint import read_config

    cfg = cfg or read_config(directory)
    video_config = PROCESSOR_RULES[family_of_config(cfg).processor].video_config
    vision_cfg = vision_cfg or VisionPreprocessConfig.from_pretrained(directory)
    video_cfg = video_cfg or video_config.from_pretrained(directory, image=vision_cfg)
    if "system" not in kw:  # a jaxcap export records the prompt its policy was trained with
      kw["system"] = read_prompt_settings(directory).get("system", TEMPLATE_DEFAULT)
    return cls(AutoTokenizer.from_pretrained(directory), cfg, vision_cfg, video_cfg=video_cfg, **kw)

  def save_prompt_settings(self, directory) -> None:
    """Writes <directory>/jaxcap_prompt.json (the system turn, None for none), which `from_pretrained` reads, so an
    exported policy is prompted as it was trained (the embedded student has no system turn; transformers ignores
    the file)."""
    (Path(directory) / PROMPT_SETTINGS).write_text(json.dumps({"system": self.system}) + "\n")

  def video(self, item: dict) -> tuple[np.ndarray, np.ndarray, float, np.ndarray]:
    """One video content item -> (patches, grid_thw, second_per_grid_t, each sampled frame's time in the video
    float64 [T] in seconds). item["video"] is a file path (sampled
    with the item's 'fps' / 'min_frames' / 'max_frames' / 'nframes', else video_cfg's), a `VideoClip`, a uint8
    array [T, H, W, C] or a list of frames (whose rate is item['fps'], else `self.fps`)."""
    source = item["video"]
    fps = item.get("fps")
    if fps is None and not isinstance(source, (str, os.PathLike)):
      fps = self.fps
    clip = load_video(
      source,
      self.video_cfg,
      fps=fps,
      min_frames=item.get("min_frames"),
      max_frames=item.get("max_frames"),
      nframes=item.get("nframes"),
      resize=True,
      record=item.get("record"),
    )
    patches, grid = preprocess_video(clip, self.video_cfg)
    return patches, grid, self.video_cfg.temporal_patch_size / clip.fps, clip.timestamps

  def __call__(
    self,
    conversations: Sequence[Sequence[dict]],
    padding_side: str = "left",
    pad_to_multiple_of: int = 1,
    add_generation_prompt: bool = True,
  ) -> ModelInputs:
    """Builds a batch from B conversations (HF message format; image items carry 'image': path / PIL / uint8
    array, video items 'video': a file path or frames, see `video`; an optional 'record' id names the item
    in errors)."""
    ids, images, videos, seconds = [], [], [], []
    merge, temporal = self.vision_cfg.merge_size, self.video_cfg.temporal_patch_size
    for index, messages in enumerate(conversations):
      own: list = []  # this conversation's vision inputs, in placeholder order: (grid, the pieces it becomes)
      for msg in messages:
        for item in msg["content"] if not isinstance(msg["content"], str) else ():
          if item.get("type") == "image":
            images.append(preprocess_image(item["image"], self.vision_cfg, record=item.get("record")))
            own.append((images[-1][1], image_pieces(images[-1][1], merge)))
          elif item.get("type") == "video":
            patches, grid, spg, times = self.video(item)
            videos.append((patches, grid))
            seconds.append(spg)
            own.append((grid, self.rules.video_pieces(grid, merge, times, temporal)))
      pieces = chat_pieces(messages, add_generation_prompt, self.system)
      ids.append(self._encode(unwrap_videos(pieces) if self.rules.unwrap_video else pieces, own, index, messages))
    input_ids, mask = pad_batch(ids, self.tokenizer.pad_token_id or 0, padding_side, pad_to_multiple_of)
    image_grid = np.stack([g for _, g in images]) if images else None
    video_grid = np.stack([g for _, g in videos]) if videos else None
    spg = np.array(seconds, np.float32) if videos else None
    positions, deltas = family_of_config(self.cfg).rope_index(self.cfg, input_ids, mask, image_grid, video_grid, spg)
    out = ModelInputs(
      input_ids, mask, positions, deltas, image_grid_thw=image_grid, video_grid_thw=video_grid, second_per_grid_ts=spg
    )
    if images or videos:
      out.pixel_values = np.concatenate([p for p, _ in images + videos]).astype(np.float32)
      out.grid_thw = np.stack([g for _, g in images + videos])
      out.layout = layout_for(out.grid_thw, self.cfg.vision)
    return out

  def _encode(self, pieces: list[tuple[str, bool]], vision: list, index: int, messages) -> list[int]:
    """Token ids of one conversation: each vision placeholder replaced by its pieces (`vision`: (grid, pieces) per
    image / video, in order: one pad per merged patch, for Qwen3-VL videos with timestamps), control pieces by id,
    runs of text through `encode_text` (special-token parsing off). The runs are exactly the text between control
    tokens that transformers tokenizes, so ids equal its processor's for ordinary text."""
    merge = self.vision_cfg.merge_size**2
    control_id = {t: self.tokenizer.convert_tokens_to_ids(t) for t in CONTROL_TOKENS}
    expanded = iter(expansion for _, expansion in vision)
    out: list[int] = []
    run: list[str] = []
    for text, control in [p for piece in pieces for p in _expand(piece, expanded)] + [("", True)]:
      if not control:
        run.append(text)
        continue
      if run and "".join(run):
        out += encode_text(self.tokenizer, "".join(run))
      run = []
      if text:
        out.append(control_id[text])
    want = sum(int(np.prod(grid)) // merge for grid, _ in vision)
    got = sum(int(i in (self.cfg.image_token_id, self.cfg.video_token_id)) for i in out)
    if got != want:
      record = next(
        (item.get("record") for m in messages if not isinstance(m["content"], str) for item in m["content"]), None
      )
      raise ValueError(
        f"conversation {index}{f' (record {record!r})' if record else ''} encodes to {got} vision placeholder tokens "
        f"but its {len(vision)} image(s)/video(s) need {want}: its text spells a vision token that this tokenizer "
        "still reads as one (a non-special added token); load a tokenizer whose <|image_pad|> and <|video_pad|> "
        "are special tokens (the checkpoint's own), or remove the token from the text."
      )
    return out


def _expand(piece: tuple[str, bool], expansions) -> list[tuple[str, bool]]:
  """A vision placeholder piece -> the next image / video's pieces; any other piece unchanged."""
  return next(expansions) if piece[1] and piece[0] in (IMAGE_PAD, VIDEO_PAD) else [piece]
