"""`jaxcap.caption` (issue 30, case 6): every path of an image folder it passes over is logged with the reason,
and a full disk ends the run with one line naming the file and the space needed, its output whole and resumable."""

import errno
import io
import json
import os

import numpy as np
import pytest
from PIL import Image

import jaxcap.models as M
from jaxcap import caption
from jaxcap.data import annotation_files
from hf_reference import save_tiny_checkpoint


def test_every_skipped_path_is_logged_with_why(tmp_path):
  (tmp_path / "sub").mkdir()
  (tmp_path / "x.jpg").mkdir()  # a directory named like an image
  Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
  Image.new("RGB", (8, 8)).save(tmp_path / "sub" / "b.jpg")
  (tmp_path / "notes.txt").write_text("not media")
  os.symlink("loop2.jpg", tmp_path / "loop1.jpg")
  os.symlink("loop1.jpg", tmp_path / "loop2.jpg")
  os.symlink("gone.png", tmp_path / "dangling.png")
  os.symlink("a.png", tmp_path / "alias.png")  # a link to an image is an image
  os.symlink("sub", tmp_path / "linked")
  log = io.StringIO()
  items = caption.list_images(tmp_path, log=lambda skipped: annotation_files.log_skipped(skipped, log))
  assert [it.id for it in items] == ["a.png", "alias.png", "sub/b.jpg"]
  assert log.getvalue().splitlines() == [
    f"jaxcap.caption: skipped {tmp_path}/dangling.png: a symbolic link to a missing file (gone.png)",
    f"jaxcap.caption: skipped {tmp_path}/linked: a symbolic link to a directory (not followed)",
    f"jaxcap.caption: skipped {tmp_path}/loop1.jpg: a symbolic link loop",
    f"jaxcap.caption: skipped {tmp_path}/loop2.jpg: a symbolic link loop",
    f"jaxcap.caption: skipped {tmp_path}/x.jpg: a directory named like a .jpg file",
    f"jaxcap.caption: skipped 1 files without an image or video suffix: {tmp_path}/notes.txt",
  ]


def _full_after(monkeypatch, path, writes: int):
  """Makes every write to `path` after the first `writes` fail as a full disk does."""
  real_open = open
  count = [0]

  def fake_open(file, mode="r", *args, **kw):
    f = real_open(file, mode, *args, **kw)
    if str(file) == str(path) and "a" in mode:
      count[0] += 1
      if count[0] > writes:

        def write(data):
          raise OSError(errno.ENOSPC, "No space left on device")

        f.write = write
    return f

  monkeypatch.setattr(annotation_files, "open", fake_open, raising=False)


def test_full_disk_ends_with_one_line_and_the_rerun_resumes(tmp_path, monkeypatch, capsys):
  save_tiny_checkpoint(M.tiny(), 0, tmp_path / "ckpt")
  images = tmp_path / "images"
  images.mkdir()
  rng = np.random.RandomState(0)
  for i in range(4):
    Image.fromarray((rng.rand(56, 56, 3) * 255).astype(np.uint8)).save(images / f"img{i}.png")
  out = tmp_path / "captions.jsonl"
  args = ["--checkpoint", str(tmp_path / "ckpt"), "--images", str(images), "--out", str(out), "--batch_size", "2"]
  args += ["--max_new_tokens", "3", "--prompt", "describe .", "--no_progress"]
  _full_after(monkeypatch, out, writes=1)  # the first batch lands, the second finds the disk full
  assert caption.main(args) == 1
  err = capsys.readouterr().err.splitlines()
  assert err[-1].startswith(f"error: no space left on the device writing {out}: ") and "bytes needed" in err[-1]
  assert "bytes free" in err[-1] and "rerun the same command" in err[-1]
  assert not any("Traceback" in line for line in err)
  first = [json.loads(line) for line in out.read_text().splitlines()]
  assert [r["id"] for r in first] == ["img0.png", "img1.png"]
  monkeypatch.undo()
  assert caption.main(args) == 0
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  assert [r["id"] for r in rows] == ["img0.png", "img1.png", "img2.png", "img3.png"] and rows[:2] == first


@pytest.mark.parametrize("code", [errno.EACCES])
def test_other_write_errors_are_not_called_a_full_disk(tmp_path, monkeypatch, code):
  path = tmp_path / "x.jsonl"

  def fake_open(*a, **kw):
    raise OSError(code, os.strerror(code))

  monkeypatch.setattr(annotation_files, "open", fake_open, raising=False)
  with pytest.raises(PermissionError):
    caption.append_lines(path, [{"id": "a"}])


@pytest.mark.parametrize("bad", ["checkpoint", "images", "out"])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, bad):
  """No checkpoint, no images folder, an output path under a file: one `error:` line naming it, no traceback."""
  save_tiny_checkpoint(M.tiny(), 0, tmp_path / "ckpt")
  images = tmp_path / "images"
  images.mkdir()
  Image.fromarray(np.zeros((56, 56, 3), np.uint8)).save(images / "a.png")
  (tmp_path / "a_file").write_text("x")
  paths = {"checkpoint": tmp_path / "ckpt", "images": images, "out": tmp_path / "captions.jsonl"}
  paths[bad] = {
    "checkpoint": tmp_path / "no_ckpt",
    "images": tmp_path / "no_images",
    "out": tmp_path / "a_file" / "c.jsonl",
  }[bad]
  args = ["--checkpoint", str(paths["checkpoint"]), "--images", str(paths["images"]), "--out", str(paths["out"])]
  assert caption.main([*args, "--max_new_tokens", "2", "--no_progress"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err[-1].startswith("error: ") and str(paths[bad].parent if bad == "out" else paths[bad]) in err[-1], err
  assert not any("Traceback" in line for line in err)


def test_a_manifest_path_outside_its_data_root_is_one_line_and_exit_2(tmp_path, capsys):
  """Issue 57: a .jsonl manifest's row outside its folder is refused before any backend starts, naming the row, the
  path and the annotator's flags; --media_root (a folder holding it) reads it."""
  save_tiny_checkpoint(M.tiny(), 0, tmp_path / "ckpt")
  (tmp_path / "images").mkdir()
  (tmp_path / "lists").mkdir()
  Image.fromarray(np.zeros((56, 56, 3), np.uint8)).save(tmp_path / "images" / "a.png")
  manifest = tmp_path / "lists" / "m.jsonl"
  manifest.write_text(json.dumps({"id": "a", "image": "../images/a.png"}) + "\n")
  capsys.readouterr()
  args = ["--checkpoint", str(tmp_path / "ckpt"), "--images", str(manifest), "--out", str(tmp_path / "c.jsonl")]
  assert caption.main([*args, "--no_progress"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err == [
    f"error: {manifest}:1 (id 'a'): media path '../images/a.png' resolves to {tmp_path / 'images' / 'a.png'}, "
    f"outside the data root {tmp_path / 'lists'}; keep the dataset's files under it, set --media_root=DIR to a "
    "folder holding them all, or --allow_outside_paths to read paths anywhere"
  ]
  items = caption.list_images(manifest, media_root=tmp_path)
  assert [(it.id, it.path) for it in items] == [("a", str(tmp_path / "lists" / "../images/a.png"))]


def test_a_training_runs_workdir_is_pointed_to_its_export(tmp_path, capsys):
  """--checkpoint runs/x (the workdir, not runs/x/export): one line naming the export, exit 2, before any backend
  starts (whose start-up logs would bury it)."""
  run = tmp_path / "run"
  save_tiny_checkpoint(M.tiny(), 0, run / "export")
  (run / "checkpoints").mkdir()
  images = tmp_path / "images"
  images.mkdir()
  capsys.readouterr()  # the checkpoint writer's progress bar
  args = ["--checkpoint", str(run), "--images", str(images), "--out", str(tmp_path / "c.jsonl"), "--no_progress"]
  assert caption.main(args) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err == [f"error: {run} is a training run's workdir; its policy is --checkpoint {run / 'export'}"]


def test_an_allocation_failure_is_one_line_naming_the_flags(tmp_path, monkeypatch, capsys):
  """XLA failing to allocate a batch (what the memory check exists to prevent): one line, exit 1, the rerun resumes;
  any other runtime error keeps its traceback."""

  class JaxRuntimeError(RuntimeError):  # jax.errors.JaxRuntimeError, by name as the annotator matches it
    pass

  def fail(error):
    def annotate(args):
      raise error

    monkeypatch.setattr(caption, "annotate", annotate)

  args = ["--checkpoint", "c", "--images", "i", "--out", str(tmp_path / "c.jsonl")]
  fail(JaxRuntimeError("INTERNAL: Error dispatching computation: Out of memory allocating 25855856144 bytes."))
  assert caption.main(args) == 1
  [line] = capsys.readouterr().err.splitlines()
  assert (
    line.startswith("error: jaxcap.caption ran out of memory (INTERNAL:") and "--batch_size or --max_pixels" in line
  )
  fail(JaxRuntimeError("INTERNAL: something else"))
  with pytest.raises(JaxRuntimeError):
    caption.main(args)
