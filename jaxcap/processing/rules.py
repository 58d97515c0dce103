"""What `Processor` does differently per student family, keyed by `Family.processor` (the family registry picks
the entry; nothing here branches on a family's name)."""

from __future__ import annotations

import dataclasses
from typing import Callable

from jaxcap.processing import chat
from jaxcap.processing.qwen3_video import Qwen3VideoPreprocessConfig
from jaxcap.processing.video import VideoPreprocessConfig
from jaxcap.registry import Registry


@dataclasses.dataclass(frozen=True)
class ProcessorRules:
  """`video_config`: the video settings class (its defaults, frame sampling and pixel budget); `video_pieces(grid_thw,
  merge_size, timestamps, temporal_patch_size)`: the chat pieces one <|video_pad|> placeholder becomes;
  `unwrap_video`: those pieces carry their own vision markers, so the template's pair around the placeholder goes.
  `hf_classes`: the transformers class names an export's processor files declare (processor, image processor, video
  processor), so `AutoProcessor` builds the family's own."""

  video_config: type[VideoPreprocessConfig]
  video_pieces: Callable[..., chat.Pieces]
  hf_classes: tuple[str, str, str]
  unwrap_video: bool = False


PROCESSOR_RULES: Registry[ProcessorRules] = Registry("processor", field="Family.processor")
QWEN25_CLASSES = ("Qwen2_5_VLProcessor", "Qwen2VLImageProcessor", "Qwen2VLVideoProcessor")
QWEN3_CLASSES = ("Qwen3VLProcessor", "Qwen2VLImageProcessorFast", "Qwen3VLVideoProcessor")
PROCESSOR_RULES.register("qwen2_vl", ProcessorRules(VideoPreprocessConfig, chat.video_pieces, QWEN25_CLASSES))
PROCESSOR_RULES.register(
  "qwen3_vl",
  ProcessorRules(Qwen3VideoPreprocessConfig, chat.timestamped_video_pieces, QWEN3_CLASSES, unwrap_video=True),
)
