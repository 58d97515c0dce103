"""Issue 16 case 8 (the eval CLI): an empty or duplicate caption is an error naming the image (or scored under an
explicit policy), and the README's command over a training run's held-out captions, which cover the first
eval.num_images images only, works with the option its error names."""

import json

import pytest
from eval_world import world

from jaxcap.eval.cli import run
from jaxcap.eval.report import EvalReport
from processes import cli, load_config


def _config(tmp_path, **overrides):
  """configs/eval.py, cut to one cheap suite on the 16-image test world."""
  c = load_config("eval").to_dict()
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
  message = str(e.value)
  assert f"'rl' ({spec})" in message and "empty caption" in message and repr(records[5].id) in message, message
  assert "re-caption" in message and "--config.empty_captions=score" in message  # the fixes
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
  message = str(e.value)
  assert message.startswith(f"{tmp_path / 'rl.jsonl'}:4: ") and repr(records[1].id) in message, message
  assert "(line 2)" in message  # the line it repeats
  assert "one row per image" in message and "--config.duplicate_captions=samples" in message  # the fixes
  run(_config(tmp_path, duplicate_captions="samples"), {"rl": spec})
  report = EvalReport.load(tmp_path / "report" / "report.json")
  assert report.model("rl").samples_per_image == 17 / 16


def _first_four(tmp_path):
  """The held-out captions of a training run with eval.num_images=4: (records, sft spec, rl spec)."""
  records = world()[1]
  sft = _captions(
    tmp_path / "sft_end.jsonl", [{"id": r.id, "caption": r.teacher_captions["terse"]} for r in records[:4]]
  )
  rl = _captions(tmp_path / "rl_end.jsonl", [{"id": r.id, "caption": r.reference_caption} for r in records[:4]])
  return records, sft, rl


def test_held_out_captions_of_the_first_images_name_the_option_that_evaluates_them(tmp_path):
  """A training run with eval.num_images=4 captioned the first 4 held-out images; the error names
  --config.num_images=4 (a key of configs/eval.py; the README's command with it: the test below)."""
  records, sft, rl = _first_four(tmp_path)
  with pytest.raises(ValueError) as e:
    run(_config(tmp_path, compare_to="sft"), {"sft": sft, "rl": rl})
  message = str(e.value)
  assert f"'sft' ({sft})" in message and "12 of 16 images" in message, message
  assert all(repr(r.id) in message for r in records[4:9])  # the first missing images, by id
  assert "the first 4 of the 16" in message and "eval.num_images" in message  # why: a training run's captions
  assert "--config.num_images=4" in message and "caption the rest" in message  # the fixes


@pytest.mark.slow  # the eval CLI in a subprocess
def test_the_option_the_error_names_evaluates_the_first_images(tmp_path):
  """The README's command over those captions, with --config.num_images=4, evaluates the first 4 images."""
  records, sft, rl = _first_four(tmp_path)
  args = ["--config=configs/eval.py", f"--config.manifest={world()[0]}"]
  args += [f"--captioner=sft={sft}", f"--captioner=rl={rl}", "--config.compare_to=sft"]
  args += [f"--config.out_dir={tmp_path / 'report'}", "--config.suites=captionqa", "--config.bootstrap.resamples=20"]
  args += ["--config.num_images=4"]
  cli("eval", *args, timeout=120)
  report = EvalReport.load(tmp_path / "report" / "report.json")
  assert report.image_ids == tuple(r.id for r in records[:4])
  assert report.settings["num_images"] == 4 and report.settings["manifest_images"] == 16
  assert "images: 4 (the first 4 of the manifest's 16)" in (tmp_path / "report" / "report.md").read_text()


def test_a_manifest_is_read_under_its_data_root(tmp_path):
  """Issue 57: a manifest whose media lie outside its folder is refused naming the row and the eval's own flags;
  `media_root` (a folder holding them) or `allow_outside_paths` reads it, and the report keeps the setting."""
  manifest, records, _ = world()
  rows = [json.loads(line) for line in manifest.read_text().splitlines()]
  for row in rows:  # absolute paths into the world's folder, from a manifest kept elsewhere
    row["image"] = str(manifest.parent / row["image"])
    row["frames"] = [str(manifest.parent / f) for f in row.get("frames", [])]
  (tmp_path / "manifests").mkdir()
  moved = tmp_path / "manifests" / "m.jsonl"
  moved.write_text("".join(json.dumps(r) + "\n" for r in rows))
  spec = _captions(tmp_path / "rl.jsonl", [{"id": r.id, "caption": r.reference_caption} for r in records])
  with pytest.raises(ValueError) as e:
    run(_config(tmp_path, manifest=str(moved)), {"rl": spec})
  message = str(e.value)
  assert message.startswith(f"{moved}:1 (id {records[0].id!r}): media path ") and "outside the data root" in message
  assert "--config.media_root=DIR" in message and "--config.allow_outside_paths=true" in message
  run(_config(tmp_path, manifest=str(moved), media_root=str(manifest.parent)), {"rl": spec})
  assert EvalReport.load(tmp_path / "report" / "report.json").settings["media_root"] == str(manifest.parent)
  run(_config(tmp_path, manifest=str(moved), allow_outside_paths=True), {"rl": spec})
