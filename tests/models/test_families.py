"""The model-family registry: names, config.json model_type lookup, clear errors."""

import json

import pytest

from jaxcap.models import families
from jaxcap.models.config import Qwen25VLConfig


def test_default_family_is_qwen2_5_vl():
  assert families.family(families.DEFAULT_FAMILY).config_cls is Qwen25VLConfig
  assert families.family_of_model_type(None).name == "qwen2_5_vl"


def test_checkpoint_dir_picks_family_from_model_type(tmp_path):
  (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl"}))
  assert families.family_of_checkpoint(tmp_path).name == "qwen2_5_vl"


def test_unknown_model_type_lists_supported(tmp_path):
  (tmp_path / "config.json").write_text(json.dumps({"model_type": "llava"}))
  with pytest.raises(ValueError, match=r"llava.*qwen2_5_vl"):
    families.family_of_checkpoint(tmp_path)
  with pytest.raises(ValueError, match=r"supported: \['qwen2_5_vl', 'qwen3_5', 'qwen3_vl'\]"):
    families.family("nope")


def test_embedded_student_of_either_family_has_the_same_sizes_and_its_own_layout():
  """`qwen3vl_like` (how `model.family=qwen3_vl` builds the embedded student) keeps the Qwen2.5-VL config's widths,
  depths and token ids, and the registry gives each family's vision config its own host layout."""
  import numpy as np

  from jaxcap.models.qwen25vl_presets import tiny
  from jaxcap.models.families import family, family_of_config, layout_for, layout_shape_for
  from jaxcap.models.qwen3vl_vision import Qwen3VisionLayout
  from jaxcap.models.vision import VisionLayout

  base = tiny()
  like = family("qwen3_vl").like_qwen25(base)
  assert family_of_config(like).name == "qwen3_vl" and family("qwen2_5_vl").like_qwen25(base) is base
  for f in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim"):
    assert getattr(like.text, f) == getattr(base.text, f), f
  assert (like.vision.depth, like.vision.hidden_size) == (base.vision.depth, base.vision.hidden_size)
  assert (like.image_token_id, like.eos_token_id) == (base.image_token_id, base.eos_token_id)
  assert sum(like.text.mrope_section) == like.text.head_dim // 2 and like.text.mrope_interleaved
  grid = np.array([[1, 4, 6]])
  assert isinstance(layout_for(grid, base.vision), VisionLayout)
  shape = layout_shape_for(grid, like.vision).bucketed(like.vision)
  layout = layout_for(grid, like.vision, shape)
  assert isinstance(layout, Qwen3VisionLayout) and layout.frames.gather.shape == (1, 32)  # 24 patches, one frame


def test_embedded_student_as_qwen35_keeps_the_sizes_and_is_hybrid():
  """`qwen35_like` (how `model.family=qwen3_5` builds the embedded student): the Qwen2.5-VL config's widths, depths
  and token ids; linear and full-attention layers both present; the Qwen3-VL tower's layout."""
  from jaxcap.models.families import family, family_of_config
  from jaxcap.models.qwen25vl_presets import tiny

  base = tiny()
  like = family("qwen3_5").like_qwen25(base)
  assert family_of_config(like).name == "qwen3_5"
  for f in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim"):
    assert getattr(like.text, f) == getattr(base.text, f), f
  assert (like.image_token_id, like.eos_token_id) == (base.image_token_id, base.eos_token_id)
  assert set(like.text.layer_types) == {"linear_attention", "full_attention"}
  assert like.text.layer_types[-1] == "full_attention" and 2 * sum(like.text.mrope_section) == like.text.rotary_dim


def test_qwen35_preprocesses_as_qwen3vl_as_transformers_does():
  """transformers maps model_type qwen3_5 to Qwen3-VL's processor classes, and so does the registry: Qwen3.5's
  processor parity is Qwen3-VL's (tests/processing/test_qwen3vl_processor.py)."""
  from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES
  from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES
  from transformers.models.auto.video_processing_auto import VIDEO_PROCESSOR_MAPPING_NAMES

  from jaxcap.models.families import family
  from jaxcap.processing.rules import PROCESSOR_RULES

  rules = PROCESSOR_RULES[family("qwen3_5").processor]
  assert family("qwen3_5").processor == family("qwen3_vl").processor
  assert PROCESSOR_MAPPING_NAMES["qwen3_5"] == PROCESSOR_MAPPING_NAMES["qwen3_vl"] == rules.hf_classes[0]
  assert IMAGE_PROCESSOR_MAPPING_NAMES["qwen3_5"] == IMAGE_PROCESSOR_MAPPING_NAMES["qwen3_vl"]
  assert VIDEO_PROCESSOR_MAPPING_NAMES["qwen3_5"] == VIDEO_PROCESSOR_MAPPING_NAMES["qwen3_vl"]
