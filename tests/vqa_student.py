"""A tiny embedded world and student for the VQA tests (not a test module): built once per session."""

from __future__ import annotations

import functools
import pathlib
import tempfile


@functools.lru_cache(maxsize=None)
def tiny_world(train_scenes: int = 8, eval_scenes: int = 6):
  """(run config, workdir, train records, held-out records, student Qwen25VL, its Processor): the embedded
  default's world (every record has curated questions) and a one-layer random student over its tokenizer."""
  from jaxcap.data.manifest import read_manifest
  from jaxcap.world import student as embedded
  from jaxcap.config_files import base_config, validate

  c = base_config()
  c.world.train_scenes, c.world.eval_scenes = train_scenes, eval_scenes
  c.model.student.update(dict(vision_width=32, vision_depth=1, text_width=64, text_layers=1, text_heads=2))
  c.sft.max_target_tokens = 24
  c.sft.batch_size = c.rl.batch_size = 4  # batches the 8 training scenes can fill (the config validates)
  workdir = pathlib.Path(tempfile.mkdtemp(prefix="jaxcap_vqa_world_"))
  train, heldout = embedded.build_world_manifests(c, workdir)
  model, processor = embedded.build_student(validate(c), workdir)  # the typed run config, as the trainer passes it
  return c, workdir, read_manifest(train).records, read_manifest(heldout).records, model, processor
