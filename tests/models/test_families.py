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
  with pytest.raises(ValueError, match=r"supported: \['qwen2_5_vl', 'qwen3_vl'\]"):
    families.family("nope")
