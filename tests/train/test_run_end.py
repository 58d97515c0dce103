"""What a user sees after a short run (issue 56): the vision warm-up shows its progress; the run ends naming its
workdir, its outputs and the next commands, and the evaluator command it prints runs; its export carries the
processor settings it trained with, so the annotator on a folder of mixed photos (up to 4,000 px) with default
flags captions them or refuses in one line before any compute, never failing an allocation."""

import json
import shlex
import subprocess

import pytest
from PIL import Image

from processes import AS_INSTALLED, TINY, cpu_env, launch, tiny_run

# photo sizes (width, height): a phone's, a scan's, a portrait, a thumbnail, a square
PHOTOS = [(1536, 1024), (4000, 3000), (640, 480), (3000, 4000), (300, 200), (1024, 1024)]


def test_end_of_run_names_only_what_the_run_wrote(tmp_path):
  from jaxcap.config_files import validate
  from jaxcap.train.shell.run_end import end_of_run
  from processes import load_config

  wd = tmp_path / "run"
  config = validate(load_config("caprl", workdir=str(wd)))
  (wd / "export").mkdir(parents=True)
  (wd / "metrics.jsonl").write_text("")
  lines = end_of_run(config)
  assert lines[0] == f"run finished: {wd}" and f"  metrics: {wd}/metrics.jsonl" in lines
  assert not any("summary" in line or "curves" in line for line in lines)  # not written: not named
  assert f"  python -m jaxcap.inspect {wd}" in lines
  assert not any("jaxcap.eval" in line or "jaxcap.caption" in line for line in lines)  # no captions, no policy


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """A tiny run that exports its policy; the held-out manifest is larger than what it evaluates (6 > 4)."""
  wd = tmp_path_factory.mktemp("run_end") / "run"
  flags = tiny_run({"export.hf": True, "world.eval_scenes": 6, "vision_warmup.steps": 3}, base=TINY)
  return wd, launch("caprl", *flags, workdir=wd, timeout=600)


@pytest.mark.slow
def test_the_run_shows_the_warm_up_and_ends_with_its_outputs_and_the_next_commands(run, tmp_path):
  wd, out = run
  assert "vision: 100%" in out.stderr.replace("\r", "\n"), out.stderr[-2000:]
  tail = out.stdout[out.stdout.index("run finished:") :].splitlines()
  assert tail[0] == f"run finished: {wd}"
  for what, path in [("policy (HF checkpoint)", "export"), ("metrics", "metrics.jsonl"), ("summary", "summary.json")]:
    assert f"  {what}: {wd / path}" in tail
  commands = [line.strip() for line in tail if line.startswith("  python -m ")]
  assert commands[0] == f"python -m jaxcap.inspect {wd}"
  assert commands[2].startswith(f"python -m jaxcap.caption --checkpoint {wd / 'export'} ")
  evaluate = shlex.split(commands[1])
  assert "--config.num_images=4" in evaluate  # what the run captioned, not the 6 of its manifest
  # as printed, from another directory (no configs/ there); two SFT steps may caption nothing: scored as written
  cmd = [*AS_INSTALLED, *evaluate[1:], "--config.empty_captions=score", "--config.suites=prism,captionqa"]
  done = subprocess.run(cmd, cwd=tmp_path, env=cpu_env(1), capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  assert json.loads((wd / "eval_report" / "report.json").read_text())


@pytest.mark.slow
def test_the_export_carries_the_processor_settings_it_trained_with(run):
  from jaxcap.processing import Processor

  wd, _ = run
  image = json.loads((wd / "export" / "preprocessor_config.json").read_text())
  assert (image["min_pixels"], image["max_pixels"]) == (56 * 56, 84 * 84)  # data.image_size = 84: its area
  assert image["image_processor_type"] == "Qwen2VLImageProcessor"
  assert (wd / "export" / "video_preprocessor_config.json").exists()
  assert Processor.from_pretrained(wd / "export").vision_cfg.max_pixels == 84 * 84


def _caption(wd, images, out, *flags, **env):
  cmd = [*AS_INSTALLED, "-m", "jaxcap.caption", "--checkpoint", str(wd / "export"), "--images", str(images)]
  cmd += ["--out", str(out), "--no_progress", *flags]
  return subprocess.run(cmd, env=cpu_env(1, **env), capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_the_annotator_on_the_export_captions_mixed_photos_or_refuses_in_one_line(run, tmp_path):
  wd, _ = run
  images = tmp_path / "photos"
  images.mkdir()
  for i, (w, h) in enumerate(PHOTOS):
    Image.new("RGB", (w, h), (30 * i, 120, 200)).save(images / f"photo{i}.jpg")
  for flags, env in [
    ((), {}),  # default flags: the export's own pixel budget
    (("--max_pixels", "12845056"), {"JAXCAP_MEMORY_BUDGET": "4GiB"}),  # the budget of issue 56's failure, 4 GiB
  ]:
    out = tmp_path / f"captions{len(flags)}.jsonl"
    done = _caption(wd, images, out, *flags, **env)
    assert "Traceback" not in done.stderr and "Out of memory" not in done.stderr, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    if done.returncode == 0:
      rows = [json.loads(line) for line in out.read_text().splitlines()]
      assert sorted(r["id"] for r in rows) == sorted(p.name for p in images.iterdir()) and not errors
    else:  # refused before any compute: one line naming the numbers and what fits, nothing written
      assert done.returncode == 2 and len(errors) == 1 and "needs about" in errors[0], done.stderr[-3000:]
      assert "--max_pixels" in errors[0] and not out.exists()
    if not flags:
      assert done.returncode == 0  # the export's budget (84 x 84 px) fits any machine that trained it
    else:
      assert done.returncode == 2  # ~4,900 patches per photo: the vision tower's attention alone is tens of GiB
