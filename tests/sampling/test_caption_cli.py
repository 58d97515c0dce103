"""`python -m jaxcap.caption`: killed mid-run and restarted, every image is captioned exactly once."""

import json
import signal
import subprocess
import time

import numpy as np
import pytest
from PIL import Image

import jaxcap.models as M
from jaxcap import caption
from hf_reference import save_tiny_checkpoint
from processes import AS_INSTALLED, start

SIZES = [(56, 56), (56, 84), (84, 56)]  # three resized shapes -> three compiled buckets


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  root = tmp_path_factory.mktemp("annotate")
  save_tiny_checkpoint(M.tiny(), 0, root / "ckpt")
  images = root / "images"
  (images / "sub").mkdir(parents=True)
  rng = np.random.RandomState(0)
  ids = []
  for i in range(12):
    h, w = SIZES[i % 3]
    rel = f"{'sub/' if i % 4 == 0 else ''}img{i:02d}.png"
    Image.fromarray((rng.rand(h, w, 3) * 255).astype(np.uint8)).save(images / rel)
    ids.append(rel)
  (images / "garbage.png").write_bytes(b"not an image at all")
  good = (images / "img01.png").read_bytes()
  (images / "truncated.png").write_bytes(good[: len(good) // 2])  # header readable, pixels not
  return root, sorted(ids)


def _args(root, out, *extra):
  return [
    "--checkpoint",
    str(root / "ckpt"),
    "--images",
    str(root / "images"),
    "--out",
    str(out),
    "--batch_size",
    "2",
    "--max_new_tokens",
    "4",
    "--prompt",
    "describe the image .",
    *extra,
  ]


def _rows(path):
  return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow
def test_killed_and_restarted_run_writes_each_image_once(setup):
  root, ids = setup
  out = root / "run" / "captions.jsonl"
  errors = out.with_name("captions.errors.jsonl")
  log = root / "first_run.log"
  with open(log, "wb") as stderr:
    proc = start([*AS_INSTALLED, "-m", "jaxcap.caption", *_args(root, out)], stdout=subprocess.DEVNULL, stderr=stderr)
  deadline = time.time() + 120
  while len(_rows(out)) < 2 and proc.poll() is None and time.time() < deadline:
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  partial = _rows(out)
  assert 2 <= len(partial) < len(ids), f"the first run should be killed mid-way:\n{log.read_text()[-3000:]}"
  with open(out, "a") as f:  # a line torn by the kill
    f.write('{"id": "img11.png", "capt')

  assert caption.main(_args(root, out, "--no_progress")) == 0
  rows = _rows(out)
  assert [r["id"] for r in rows[: len(partial)]] == [r["id"] for r in partial]  # finished lines untouched
  assert sorted(r["id"] for r in rows) == ids  # each image exactly once
  assert all(isinstance(r["caption"], str) and 0 <= r["tokens"] <= 4 for r in rows)
  errs = {r["id"]: r["error"] for r in _rows(errors)}
  assert sorted(errs) == ["garbage.png", "truncated.png"] and all("image" in e for e in errs.values())

  assert caption.main(_args(root, out, "--no_progress")) == 0  # a finished run is a no-op
  assert len(_rows(out)) == len(ids) and len(_rows(errors)) == 2


@pytest.mark.slow
def test_process_shards_split_the_work(setup):
  root, ids = setup
  out = root / "sharded" / "captions.jsonl"
  for i in range(2):
    assert caption.main(_args(root, out, "--no_progress", "--process_index", str(i), "--process_count", "2")) == 0
  shards = [_rows(out.with_name(f"captions-{i:05d}-of-00002.jsonl")) for i in range(2)]
  got = [r["id"] for shard in shards for r in shard]
  assert sorted(got) == ids and all(shards)


def test_listing_sources(setup, tmp_path):
  root, ids = setup
  manifest = tmp_path / "m.jsonl"
  manifest.write_text(
    "".join(json.dumps({"id": f"x{i}", "image": str(root / "images" / rel)}) + "\n" for i, rel in enumerate(ids[:3]))
  )
  # the images lie outside the manifest's folder: refused by default, read under their data root or when allowed
  with pytest.raises(ValueError, match="outside the data root"):
    caption.list_images(manifest)
  assert [it.id for it in caption.list_images(manifest, media_root=root)] == ["x0", "x1", "x2"]
  assert [it.id for it in caption.list_images(manifest, allow_outside_paths=True)] == ["x0", "x1", "x2"]
  manifest.write_text(manifest.read_text() + json.dumps({"id": "x0", "image": "a.png"}) + "\n")
  with pytest.raises(ValueError, match="x0"):
    caption.list_images(manifest, allow_outside_paths=True)
  with pytest.raises(FileNotFoundError, match="--images"):
    caption.list_images(tmp_path / "missing")


@pytest.mark.parametrize(
  "engine",
  [[], ["--engine", "paged", "--slots", "2", "--page_size", "4", "--batch_size", "3"]],
  ids=["static", "paged"],
)
@pytest.mark.slow
def test_mixed_sizes_and_a_video_caption_as_each_alone(setup, tmp_path, engine, monkeypatch):
  """One batch of images of three sizes and an mp4 clip: each caption equals greedy decoding of that item alone
  (static sampler, one device), with either engine: the static one on the test's 8 devices, the paged one on 2
  (one engine per device) with fewer slots than items, its two batches (3 items, then 1: padded to 2 rows so
  that both devices still split it) streamed through one engine call, slots refilled across them."""
  import av
  import jax

  from jaxcap.processing import load_image, read_video
  from jaxcap.sampling import Sampler, SamplingConfig, mesh_shards

  plans = []
  if "paged" in engine:  # the process's local devices are 2
    devices, spread = jax.local_devices()[:2], mesh_shards.spread
    monkeypatch.setattr(jax, "local_devices", lambda *a, **k: devices)
    monkeypatch.setattr(mesh_shards, "spread", lambda *a: plans.append(spread(*a)) or plans[-1])

  root, _ = setup
  folder = tmp_path / "media"
  folder.mkdir()
  rng = np.random.RandomState(1)
  for i, (h, w) in enumerate([(56, 56), (84, 140), (112, 56)]):
    Image.fromarray((rng.rand(h, w, 3) * 255).astype(np.uint8)).save(folder / f"img{i}.png")
  with av.open(str(folder / "clip.mp4"), "w") as container:
    stream = container.add_stream("mpeg4", rate=4)
    stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
    for k in range(12):
      frame = av.VideoFrame.from_ndarray((rng.rand(48, 64, 3) * 255).astype(np.uint8), format="rgb24")
      container.mux(stream.encode(frame))
    container.mux(stream.encode())
  out = tmp_path / "captions.jsonl"
  args = ["--checkpoint", str(root / "ckpt"), "--images", str(folder), "--out", str(out), "--batch_size", "4"]
  assert caption.main([*args, "--max_new_tokens", "5", "--prompt", "describe .", "--no_progress", *engine]) == 0
  got = {r["id"]: r["caption"] for r in _rows(out)}
  assert sorted(got) == ["clip.mp4", "img0.png", "img1.png", "img2.png"]
  if "paged" in engine:  # one call, each of both devices an engine over its share of both batches
    assert [plan.runners for plan in plans] == [devices]
  sampler = Sampler.from_checkpoint(root / "ckpt", sampling=SamplingConfig(temperature=0, max_new_tokens=5))
  proc = sampler.processor
  for name, text in got.items():
    path = folder / name
    if name.endswith(".mp4"):
      media = {"type": "video", "video": read_video(path, proc.video_cfg, resize=True)}
    else:
      media = {"type": "image", "image": load_image(path)}
    alone = sampler([[{"role": "user", "content": [media, {"type": "text", "text": "describe ."}]}]], jax.random.key(0))
    assert alone.text[0] == text, name


def _clip(path, frames: int, rate: int, rng):
  """An mp4 of `frames` random 64 x 48 frames at `rate` frames per second, written with PyAV."""
  import av

  with av.open(str(path), "w") as container:
    stream = container.add_stream("mpeg4", rate=rate)
    stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
    for _ in range(frames):
      frame = av.VideoFrame.from_ndarray((rng.rand(48, 64, 3) * 255).astype(np.uint8), format="rgb24")
      container.mux(stream.encode(frame))
    container.mux(stream.encode())


@pytest.mark.slow
def test_videos_are_sampled_as_the_run_sampled_them_or_as_the_video_flags_say(setup, tmp_path, monkeypatch):
  """A folder with a 6 s clip (24 frames at 4 fps) and an image, captioned from a run's export: the clip's frames
  are sampled as the export's video_preprocessor_config.json says (the run's data.video_fps=1: 6 frames, not the
  family's default 2 fps: 12), and --video_fps / --video_max_frames override that by the run's rule
  (`with_sampling`: 2 fps capped at 4 frames); flags the processor cannot take are one line, exit 2."""
  from jaxcap import processing
  from jaxcap.processing import Processor
  from jaxcap.processing.processor_files import save_processor_configs

  root, _ = setup
  export = tmp_path / "export"  # as a run exports its policy: the run's own frame sampling beside the weights
  export.mkdir()
  for f in (root / "ckpt").iterdir():
    (export / f.name).write_bytes(f.read_bytes())
  processor = Processor.from_pretrained(export)
  processor.video_cfg = processor.video_cfg.with_sampling(fps=1.0)
  save_processor_configs(processor, export, square_side=56)
  folder = tmp_path / "media"
  folder.mkdir()
  rng = np.random.RandomState(2)
  _clip(folder / "clip.mp4", 24, 4, rng)
  Image.fromarray((rng.rand(56, 56, 3) * 255).astype(np.uint8)).save(folder / "img.png")
  sampled = []
  read_video = processing.read_video

  def recording(path, cfg, **kw):
    clip = read_video(path, cfg, **kw)
    sampled.append((cfg.fps, len(clip.frames)))
    return clip

  monkeypatch.setattr(processing, "read_video", recording)

  def run(name, *flags):
    out = tmp_path / f"{name}.jsonl"
    args = ["--checkpoint", str(export), "--images", str(folder), "--out", str(out), "--max_new_tokens", "3"]
    code = caption.main([*args, "--no_progress", *flags])
    return code, sorted(r["id"] for r in _rows(out))

  assert run("export") == (0, ["clip.mp4", "img.png"]) and sampled == [(1.0, 6)]
  sampled.clear()
  assert run("flags", "--video_fps", "2", "--video_max_frames", "4") == (0, ["clip.mp4", "img.png"])
  assert sampled == [(2.0, 4)]


def test_video_flags_the_processor_cannot_take_are_one_line(setup, tmp_path, capsys):
  root, _ = setup
  args = ["--checkpoint", str(root / "ckpt"), "--images", str(root / "images"), "--out", str(tmp_path / "o.jsonl")]
  assert caption.main([*args, "--video_min_pixels", "40000", "--video_max_pixels", "4000"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err[-1].startswith("error: each frame's pixel ceiling --video_max_pixels=4000 is below its floor"), err
  with pytest.raises(SystemExit) as e:
    caption.parse_args([*args, "--video_fps", "0"])
  assert e.value.code == 2
