"""Inputs for Qwen2.5-VL: image/video preprocessing, chat prompts, tokenizers."""

from jaxcap.processing.prompt import ModelInputs, Processor, pad_batch, render_chat
from jaxcap.processing.tokenizer import word_tokenizer
from jaxcap.processing.vision import VisionPreprocessConfig, preprocess_image, preprocess_video, smart_resize
