"""Inputs for the students (Qwen2.5-VL, Qwen3-VL): image/video preprocessing, chat prompts, tokenizers."""

from jaxcap.processing.chat import render_chat
from jaxcap.processing.image_decoding import load_image, read_image_size
from jaxcap.processing.model_inputs import ModelInputs, pad_batch
from jaxcap.processing.prompt import Processor
from jaxcap.processing.qwen3_video import Qwen3VideoPreprocessConfig
from jaxcap.processing.tokenizer import word_tokenizer
from jaxcap.processing.video import VideoClip, VideoPreprocessConfig, smart_nframes
from jaxcap.processing.video_frames import load_video, preprocess_video, probe_video, read_video, video_file_grid
from jaxcap.processing.vision import VisionPreprocessConfig, preprocess_image, smart_resize
