"""Issue 16 case 8 (the eval CLI): an empty or duplicate caption is an error naming the image (or scored under an
explicit policy), and the README's command over a training run's held-out captions, which cover the first
eval.num_images images only, works with the option its error names."""

import json
import os
import subprocess
import sys

import pytest
from eval_world import world

from jaxcap.eval.cli import run
from jaxcap.eval.report import EvalReport

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _config(tmp_path, **overrides):
  """configs/eval.py, cut to one cheap suite on the 16-image test world."""
  import importlib.util

  spec = importlib.util.spec_from_file_location("eval_config", os.path.join(REPO, "configs", "eval.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config().to_dict()
  c.update(manifest=str(world()[0]), suites="captionqa", baselines={}, honest="", out_dir=str(tmp_path / "report"))
  c["bootstrap"]["resamples"] = 20
  c.update(overrides)
  return c


def _captions(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return f"jsonl:{path}"


def test_empty_caption_is_an_error_naming_the_image(tmp_path):
  records = world()[1]
  rows = [{"id": r.id, "caption": r.reference_caption} for r in records]
  rows[5]["caption"] = "  "
  spec = _captions(tmp_path / "rl.jsonl", rows)
  with pytest.raises(ValueError) as e:
    run(_config(tmp_path), {"rl": spec})
  assert str(e.value) == (
    f"Captioner 'rl' ({spec}) has an empty caption for 1 of 16 images ({records[5].id!r}); re-caption them, or "
    "set --config.empty_captions=score to score empty captions as written."
  )
  assert not (tmp_path / "report").exists()  # nothing scored
  run(_config(tmp_path, empty_captions="score"), {"rl": spec})
  report = EvalReport.load(tmp_path / "report" / "report.json")
  assert report.settings["empty_captions_scored"] == {"rl": 1}
  assert "empty captions scored as written: {'rl': 1}" in (tmp_path / "report" / "report.md").read_text()


def test_duplicate_caption_is_an_error_naming_the_image_and_lines(tmp_path):
  records = world()[1]
  rows = [{"id": r.id, "caption": r.reference_caption} for r in records]
  rows.insert(3, {"id": records[1].id, "caption": "written twice"})  # line 4 repeats line 2's image
  spec = _captions(tmp_path / "rl.jsonl", rows)
  with pytest.raises(ValueError) as e:
    run(_config(tmp_path), {"rl": spec})
  assert str(e.value) == (
    f"{tmp_path / 'rl.jsonl'}:4: image {records[1].id!r} already has a caption (line 2); keep one row per image "
    "(several samples go in one row's 'captions' list), or set --config.duplicate_captions=samples to score every "
    "row as a sample."
  )
  run(_config(tmp_path, duplicate_captions="samples"), {"rl": spec})
  report = EvalReport.load(tmp_path / "report" / "report.json")
  assert report.model("rl").samples_per_image == 17 / 16


def test_held_out_captions_of_the_first_images_name_the_option_that_evaluates_them(tmp_path):
  """A training run with eval.num_images=4 captioned the first 4 held-out images; the error names
  --config.num_images=4 (a key of configs/eval.py), and with it the README's command evaluates those 4."""
  records = world()[1]
  sft = _captions(
    tmp_path / "sft_end.jsonl", [{"id": r.id, "caption": r.teacher_captions["terse"]} for r in records[:4]]
  )
  rl = _captions(tmp_path / "rl_end.jsonl", [{"id": r.id, "caption": r.reference_caption} for r in records[:4]])
  with pytest.raises(ValueError) as e:
    run(_config(tmp_path, compare_to="sft"), {"sft": sft, "rl": rl})
  missing = ", ".join(repr(r.id) for r in records[4:9])
  assert str(e.value) == (
    f"Captioner 'sft' ({sft}) has no caption for 12 of 16 images ({missing}, ...); it covers the first 4 of the 16 "
    "manifest images (a training run's held-out captions cover the first eval.num_images): pass "
    "--config.num_images=4 to evaluate those, or caption the rest."
  )
  cmd = [sys.executable, "-m", "jaxcap.eval", "--config=configs/eval.py", f"--config.manifest={world()[0]}"]
  cmd += [f"--captioner=sft={sft}", f"--captioner=rl={rl}", "--config.compare_to=sft"]
  cmd += [f"--config.out_dir={tmp_path / 'report'}", "--config.suites=captionqa", "--config.bootstrap.resamples=20"]
  cmd += ["--config.num_images=4"]
  done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
  assert done.returncode == 0, done.stderr[-2000:]
  report = EvalReport.load(tmp_path / "report" / "report.json")
  assert report.image_ids == tuple(r.id for r in records[:4])
  assert report.settings["num_images"] == 4 and report.settings["manifest_images"] == 16
  assert "images: 4 (the first 4 of the manifest's 16)" in (tmp_path / "report" / "report.md").read_text()
