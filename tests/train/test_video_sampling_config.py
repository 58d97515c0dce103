"""The run config's video sampling (`data.video_fps`, `video_min_frames` / `video_max_frames`, `video_min_pixels` /
`video_max_pixels` per frame, `video_total_pixels` per clip) reaches the processor the trainer builds, for the
embedded student and for a checkpoint (`jaxcap.train.shell.setup._student`): the video config holds the values, a
clip written here is sampled to the frame count they give, 0 keeps the checkpoint's own, and a bad pair is refused
naming the fields."""

import json

import av
import numpy as np
import pytest

import jaxcap.models as M
from jaxcap.checkpoint import read_config
from jaxcap.config_files import base_config, validate
from jaxcap.data.records import ImageRecord
from jaxcap.processing import Qwen3VideoPreprocessConfig, VideoPreprocessConfig, word_tokenizer
from jaxcap.train.rollouts.batching import Batcher
from jaxcap.train.shell import setup

SECONDS, RATE = 8, 10  # the clip: 80 frames at 10 fps (the default 2 fps samples 16 of them)
# the checkpoint's own video processor config, unlike every default
CHECKPOINT_VIDEO = {"fps": 3.0, "min_frames": 2, "max_frames": 30, "min_pixels": 28 * 28, "max_pixels": 28 * 28 * 6}


def _clip(path, seconds=SECONDS, fps=RATE, size=(48, 64)):
  with av.open(str(path), "w") as container:
    stream = container.add_stream("mpeg4", rate=fps)
    stream.height, stream.width, stream.pix_fmt = *size, "yuv420p"
    for i in range(seconds * fps):
      frame = np.full((*size, 3), (i * 3) % 256, np.uint8)
      for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
        container.mux(packet)
    for packet in stream.encode():
      container.mux(packet)
  return path


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
  return _clip(tmp_path_factory.mktemp("clip") / "a.mp4")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  return tmp_path_factory.mktemp("run")  # the world's tokenizer, trained once for the module


def _config(model=None, **data):
  c = base_config()
  c.model.student.update(dict(vision_width=32, vision_depth=1, text_width=64, text_layers=1, text_heads=2))
  c.model.update(model or {})
  c.data.update(data)
  return c


def _grid(processor, run, clip) -> list[int]:
  """The video grid (t, h, w) of `clip` in the batch the trainer's batcher builds with `processor`."""
  return Batcher(processor, run, None, media_threads=1).inputs([ImageRecord(id="v", image=str(clip))]).video_grid_thw[0]


def _frames(processor, run, clip) -> int:
  """Frames sampled from `clip` (grid_t x the temporal patch)."""
  return int(_grid(processor, run, clip)[0]) * processor.video_cfg.temporal_patch_size


@pytest.mark.parametrize(
  "data, fps, max_frames, frames",
  [
    ({"video_fps": 1, "video_max_frames": 4}, 1.0, 4, 4),  # 8 s at 1 fps = 8, capped at 4
    ({"video_fps": 1}, 1.0, 768, 8),  # 8 s at 1 fps
    ({}, 2.0, 768, 16),  # 0 keeps the student's defaults: 2 fps, 4..768 frames
  ],
)
def test_embedded_students_processor_samples_as_the_run_says(workdir, clip, data, fps, max_frames, frames):
  run = validate(_config(**data))
  _, processor = setup._student(run, workdir, None)
  video = processor.video_cfg
  assert (video.fps, video.min_frames, video.max_frames) == (fps, 4, max_frames)
  assert _frames(processor, run, clip) == frames


@pytest.fixture
def checkpoint(tmp_path, monkeypatch):
  """A checkpoint directory with config.json, a tokenizer and a video processor config (no weights: the load is
  stubbed, so `_student` runs everything else it does for a checkpoint)."""
  cfg, directory = M.tiny(), tmp_path / "checkpoint"
  directory.mkdir()
  (directory / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
  word_tokenizer(["describe", "this", "."], cfg).save_pretrained(directory)
  (directory / "video_preprocessor_config.json").write_text(json.dumps(CHECKPOINT_VIDEO))

  class Loaded:
    def __init__(self, path, mesh=None, **compute):
      self.cfg = read_config(path, **compute)

  monkeypatch.setattr(setup, "load_hf_checkpoint", Loaded)
  return directory


def _checkpoint_run(checkpoint, **data):
  return validate(_config(model={"checkpoint": str(checkpoint)}, image_size=0, **data))  # frames at native size


def test_checkpoints_processor_takes_the_runs_video_settings_and_keeps_its_own_where_0(checkpoint, clip, tmp_path):
  run = _checkpoint_run(checkpoint)
  _, processor = setup._student(run, tmp_path, None)
  assert processor.video_cfg == VideoPreprocessConfig.from_pretrained(checkpoint)  # all 0: the checkpoint's own
  assert _frames(processor, run, clip) == 24  # 8 s at its 3 fps

  run = _checkpoint_run(checkpoint, video_fps=1, video_max_frames=4)
  _, processor = setup._student(run, tmp_path, None)
  video = processor.video_cfg
  assert (video.fps, video.max_frames) == (1.0, 4)
  assert (video.min_frames, video.min_pixels, video.max_pixels) == (2, 28 * 28, 28 * 28 * 6)  # the checkpoint's
  assert _frames(processor, run, clip) == 4


@pytest.mark.parametrize(
  "data",
  [
    {"video_max_pixels": 28 * 28 * 2},  # each frame within 2 x 28 x 28 px: 48 x 64 -> 28 x 28
    {"video_total_pixels": 28 * 28 * 4},  # the clip's, shared over its frames: 4 x 784 x 2 (temporal) // 4 frames
  ],
)
def test_checkpoints_processor_takes_the_runs_pixel_budgets(checkpoint, clip, tmp_path, data):
  run = _checkpoint_run(checkpoint, video_max_frames=4)
  assert _grid(setup._student(run, tmp_path, None)[1], run, clip).tolist() == [2, 4, 4]  # 56 x 56: its own budget
  run = _checkpoint_run(checkpoint, video_max_frames=4, **data)
  _, processor = setup._student(run, tmp_path, None)
  assert processor.video_cfg.frame_max_pixels(4) == 28 * 28 * 2
  assert _grid(processor, run, clip).tolist() == [2, 2, 2]


def test_a_setting_the_checkpoint_cannot_take_fails_before_the_load(checkpoint, monkeypatch, tmp_path):
  def no_load(*a, **k):
    raise AssertionError("the checkpoint was loaded before the settings were checked")

  monkeypatch.setattr(setup, "load_hf_checkpoint", no_load)
  run = _checkpoint_run(checkpoint, video_max_pixels=28 * 28 // 2)
  with pytest.raises(
    ValueError, match=r"data\.video_max_pixels=392 is below its floor, 784 px .*data\.video_min_pixels"
  ):
    setup._student(run, tmp_path, None)


@pytest.mark.parametrize(
  "data, message",
  [
    ({"video_min_frames": 8, "video_max_frames": 4}, "data.video_min_frames=8, video_max_frames=4: need"),
    ({"video_min_pixels": 5000, "video_max_pixels": 4000}, "data.video_min_pixels=5000, video_max_pixels=4000: need"),
    ({"video_max_frames": 1}, "data.video_max_frames=1: a clip needs at least 2 frames"),
    ({"video_fps": -1.0}, "data.video_fps=-1.0: must be >= 0"),
  ],
)
def test_bad_video_settings_fail_validation_naming_the_field(data, message):
  with pytest.raises(ValueError) as e:
    validate(_config(**data))
  assert message in str(e.value) and str(e.value).count("\n  - ") == 1, str(e.value)
  validate(_config(**{k: 0 for k in data}))  # 0 = the checkpoint's own: valid


def test_qwen3_vl_video_budget_is_per_clip():
  """Qwen3-VL's min_pixels / max_pixels bound the whole clip: the clip budget sets max_pixels, a per-frame ceiling
  sets max_video_tokens with the cap on, and a per-frame floor is refused (at validation for the embedded
  student, at build for a checkpoint)."""
  names = {arg: f"data.{key}" for key, arg in setup.VIDEO_SAMPLING.items()}
  base = Qwen3VideoPreprocessConfig()
  got = base.with_sampling(fps=1, max_frames=6, total_pixels=32 * 32 * 40, max_frame_pixels=32 * 32 * 200 + 5)
  assert (got.fps, got.max_frames, got.max_pixels) == (1.0, 6, 32 * 32 * 40)
  assert (got.max_video_tokens, got.cap_pixels_per_frame, got.min_pixels) == (200, True, base.min_pixels)
  with pytest.raises(ValueError, match=r"data\.video_min_pixels=1000: Qwen3-VL's video processor has no per-frame"):
    base.with_sampling(min_frame_pixels=1000, names=names)
  with pytest.raises(ValueError, match=r"data\.video_max_pixels=1000 is below the per-frame floor 137625 px"):
    base.with_sampling(max_frame_pixels=1000, names=names)
  with pytest.raises(ValueError) as e:
    validate(_config(model={"family": "qwen3_vl"}, video_min_pixels=1000))
  assert "data.video_min_pixels=1000: the qwen3_vl student's video processor has no per-frame" in str(e.value)
  validate(_config(model={"family": "qwen3_vl"}, video_max_pixels=200_000, video_total_pixels=10**6))
