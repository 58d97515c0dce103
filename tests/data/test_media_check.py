"""Issue 16 case 4 (bad media): every record's media is decoded before training, bad records are listed in one
error ("fail") or dropped into workdir/media_errors.jsonl ("skip"); a decompression bomb names its record."""

import io
import json
import re

import numpy as np
import pytest
from PIL import Image

from jaxcap.data.media_check import MediaError, check_record_media
from jaxcap.processing.media import decode_problem
from jaxcap.data.records import ImageRecord

TRUNCATED = r"OSError: image file is truncated \(\d+ bytes not processed\)"


def _jpeg(path, seed=0):
  pixels = np.random.default_rng(seed).integers(0, 255, (32, 32, 3), dtype=np.uint8)
  Image.fromarray(pixels).save(path, "JPEG", quality=90)
  return str(path)


def _truncated_jpeg(path):
  """A JPEG cut in half: its header opens, its pixels do not decode."""
  buf = io.BytesIO()
  Image.fromarray(np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(buf, "JPEG", quality=90)
  path.write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
  return str(path)


@pytest.fixture
def media(tmp_path):
  """Three good stills, a truncated JPEG, a missing file and a clip with one undecodable frame."""
  good = [_jpeg(tmp_path / f"good{i}.jpg", i) for i in range(3)]
  cut = _truncated_jpeg(tmp_path / "cut.jpg")
  (tmp_path / "text.png").write_text("not an image")
  train = [
    ImageRecord("a", image=good[0]),
    ImageRecord("b", image=cut),
    ImageRecord("c", image=str(tmp_path / "gone.jpg")),
    ImageRecord("d", image=good[1]),
    ImageRecord("clip", image=good[0], frames=(good[0], str(tmp_path / "text.png"), good[1])),
    ImageRecord("clip_ok", image=good[0], frames=(good[0], good[2])),
  ]
  held_out = [ImageRecord("h1", image=good[2]), ImageRecord("h2", image=cut)]
  return tmp_path, {"train": train, "held-out": held_out}


def test_fail_lists_every_bad_record_in_one_error(media):
  tmp, splits = media
  with pytest.raises(MediaError) as e:
    check_record_media(splits, policy="fail", workdir=tmp / "run", decode=decode_problem, progress=False)
  expected = (
    f"4 of 8 records have media that cannot be decoded, all listed in {tmp / 'run' / 'media_errors.jsonl'}:\n"
    f"  train record 'b': {tmp / 'cut.jpg'}: {TRUNCATED}\n"
    f"  train record 'c': {tmp / 'gone.jpg'}: no such file\n"
    f"  train record 'clip': {tmp / 'text.png'}: UnidentifiedImageError: cannot identify image file "
    f"'{tmp / 'text.png'}'\n"
    f"  held-out record 'h2': {tmp / 'cut.jpg'}: {TRUNCATED}\n"
    "Fix or remove these files (relative paths are resolved against the manifest's folder), or set "
    "--config.data.bad_media=skip to train on the other records."
  )
  assert re.fullmatch(re.escape(expected).replace(re.escape(TRUNCATED), TRUNCATED), str(e.value)), str(e.value)
  assert sorted(p.name for p in (tmp / "run").iterdir()) == ["media_errors.jsonl"]


def test_skip_trains_on_the_rest_and_writes_the_errors_file(media, capsys):
  tmp, splits = media
  kept = check_record_media(splits, policy="skip", workdir=tmp / "run", decode=decode_problem, progress=False)
  assert {k: [r.id for r in v] for k, v in kept.items()} == {"train": ["a", "d", "clip_ok"], "held-out": ["h1"]}
  rows = [json.loads(line) for line in (tmp / "run" / "media_errors.jsonl").read_text().splitlines()]
  assert [(r["split"], r["id"], r["file"]) for r in rows] == [
    ("train", "b", str(tmp / "cut.jpg")),
    ("train", "c", str(tmp / "gone.jpg")),
    ("train", "clip", str(tmp / "text.png")),
    ("held-out", "h2", str(tmp / "cut.jpg")),
  ]
  assert re.fullmatch(TRUNCATED, rows[0]["reason"]) and rows[1]["reason"] == "no such file"
  assert capsys.readouterr().out == (
    "media check: skipped 4 records whose media does not decode (3 of 6 train, 1 of 2 held-out), all listed in "
    f"{tmp / 'run' / 'media_errors.jsonl'}\n"
  )
  # once the files are fixed, the stale list goes away
  good = {k: [r for r in v if r.id in ("a", "h1")] for k, v in splits.items()}
  check_record_media(good, policy="skip", workdir=tmp / "run", decode=decode_problem, progress=False)
  assert list((tmp / "run").iterdir()) == []


def test_skip_refuses_a_split_with_nothing_left(media):
  tmp, splits = media
  with pytest.raises(MediaError, match=r"^every held-out record has media that cannot be decoded, all listed in "):
    check_record_media(
      {"held-out": splits["held-out"][1:]}, policy="skip", workdir=tmp, decode=decode_problem, progress=False
    )
  with pytest.raises(ValueError, match=r"^data.bad_media='ignore': use one of \('fail', 'skip'\)\.$"):
    check_record_media(splits, policy="ignore")


def test_decompression_bomb_names_its_record(tmp_path, monkeypatch):
  Image.new("RGB", (64, 64)).save(tmp_path / "huge.png")
  monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # 64 x 64 is then over twice the limit: an error
  with pytest.raises(MediaError) as e:
    check_record_media(
      {"train": [ImageRecord("bomb", image=str(tmp_path / "huge.png"))]}, decode=decode_problem, progress=False
    )
  line = str(e.value).splitlines()[1]  # the reason's wording is the image loader's (jaxcap.processing.image_decoding)
  assert line.startswith(f"  train record 'bomb': {tmp_path / 'huge.png'}: ") and "decompression bomb" in line, line


def test_training_setup_checks_media_before_any_compute(tmp_path, monkeypatch):
  """The trainer's setup runs the check on the manifests it reads (the student is stubbed: no model is built)."""
  from jaxcap.train.shell import setup
  from jaxcap.config_files import base_config

  _jpeg(tmp_path / "ok.jpg")
  _truncated_jpeg(tmp_path / "cut.jpg")
  rows = [{"id": "ok", "image": "ok.jpg"}, {"id": "cut", "image": "cut.jpg"}]
  (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  config = base_config()
  config.data.train_manifest = str(tmp_path / "train.jsonl")
  config.sft.targets = "reference"  # the synthetic world's targets need its scenes
  monkeypatch.setattr(setup, "_student", lambda *a: (None, None))
  monkeypatch.setattr(setup, "build_judge", lambda *a, **k: None)  # the rule-based judge needs synthetic scenes
  monkeypatch.setattr(setup, "preflight_judge", lambda judge, *a, **k: judge, raising=False)
  with pytest.raises(MediaError) as e:
    setup.build(config, tmp_path / "run")
  assert str(e.value).splitlines()[1].startswith(f"  train record 'cut': {tmp_path / 'cut.jpg'}: OSError: image file")
  config.data.bad_media = "skip"
  built = setup.build(config, tmp_path / "run")
  assert [r.id for r in built.train_records] == ["ok"]
  assert json.loads((tmp_path / "run" / "media_errors.jsonl").read_text())["id"] == "cut"


def test_video_files_are_decoded_too(tmp_path):
  """A video file in `image` is decoded at the frames training samples; a cut one is listed with its record."""
  av = pytest.importorskip("av")
  path = tmp_path / "clip.mp4"
  with av.open(str(path), "w") as container:
    stream = container.add_stream("mpeg4", rate=4)
    stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
    for i in range(8):
      frame = av.VideoFrame.from_ndarray(np.full((48, 64, 3), i * 30, np.uint8), format="rgb24")
      for packet in stream.encode(frame):
        container.mux(packet)
    for packet in stream.encode():
      container.mux(packet)
  (tmp_path / "cut.mp4").write_bytes(path.read_bytes()[: path.stat().st_size // 2])
  records = [ImageRecord("ok", image=str(path)), ImageRecord("cut", image=str(tmp_path / "cut.mp4"))]
  kept = check_record_media(
    {"train": records}, policy="skip", workdir=tmp_path / "run", decode=decode_problem, progress=False
  )
  assert [r.id for r in kept["train"]] == ["ok"]
  (row,) = [json.loads(line) for line in (tmp_path / "run" / "media_errors.jsonl").read_text().splitlines()]
  assert (row["id"], row["file"]) == ("cut", str(tmp_path / "cut.mp4")) and "video" in row["reason"], row
