"""Video files: qwen-vl-utils' frame-count rule on hand-computed cases, its frame indices and torch's uint8
antialiased bicubic resize against torch itself, and mp4 / webm / mkv clips made here with PyAV."""

import av
import numpy as np
import pytest
import torch

from jaxcap.processing import VideoPreprocessConfig, preprocess_video, read_video, smart_nframes
from jaxcap.processing.resize import resize_bicubic_aa
from jaxcap.processing.video import sample_indices


@pytest.mark.parametrize(
  "total, video_fps, kw, want",
  [
    (663, 25.0, {}, 52),  # 663 / 25 * 2 = 53.04 -> floor to a multiple of 2
    (250, 24.0, {"fps": 1.0}, 10),  # 10.42 -> 10
    (60, 25.0, {}, 4),  # 4.8 -> 4
    (30, 30.0, {}, 4),  # 2 -> raised to min_frames 4
    (3, 30.0, {}, 2),  # min_frames 4 > 3 frames: capped by floor2(total) = 2
    (50, 25.0, {"min_frames": 5}, 6),  # min_frames rounded up to 6
    (1000, 25.0, {"max_frames": 25}, 24),  # max_frames rounded down to 24
    (100_000, 25.0, {}, 768),  # 8000 -> FPS_MAX_FRAMES
    (100, 25.0, {"nframes": 7}, 8),  # nframes rounded to a multiple of 2: round(3.5) = 4 (Python ties to even)
    (100, 25.0, {"nframes": 9}, 8),  # round(4.5) = 4
    (100, 25.0, {"nframes": 12}, 12),
    (40, 10.0, {"fps": 30.0}, 40),  # asking for more frames than the file has: all of them
  ],
)
def test_frame_count_rule(total, video_fps, kw, want):
  assert smart_nframes(total, video_fps, **kw) == want


def test_frame_count_rule_rejects_single_frames():
  with pytest.raises(ValueError, match="at least 2 frames"):
    smart_nframes(1, 25.0)


@pytest.mark.parametrize("total, n", [(663, 52), (60, 4), (3, 2), (100_000, 768), (1001, 10), (250, 250)])
def test_sample_indices_equal_torch_linspace(total, n):
  want = torch.linspace(0, total - 1, n).round().long().numpy()  # qwen-vl-utils' _read_video_decord
  np.testing.assert_array_equal(sample_indices(total, n), want)


@pytest.mark.parametrize(
  "src, dst", [((48, 64), (28, 56)), ((50, 66), (56, 56)), ((37, 91), (140, 28)), ((300, 200), (84, 56))]
)
def test_resize_equals_torch_uint8_antialiased_bicubic(src, dst):
  frames = np.random.RandomState(sum(src)).randint(0, 256, (3, *src, 3)).astype(np.uint8)
  want = torch.nn.functional.interpolate(
    torch.from_numpy(frames).permute(0, 3, 1, 2), size=dst, mode="bicubic", antialias=True, align_corners=False
  )
  np.testing.assert_array_equal(resize_bicubic_aa(frames, *dst), want.permute(0, 2, 3, 1).numpy())


def _encode(path, frames, codec, fps=25, size=(64, 48)):
  """A clip whose frame i has red = 7 i (mod 256): a decoded frame tells its index."""
  with av.open(str(path), "w") as container:
    stream = container.add_stream(codec, rate=fps)
    stream.width, stream.height, stream.pix_fmt = *size, "yuv420p"
    for i in range(frames):
      img = np.full((size[1], size[0], 3), 128, np.uint8)
      img[..., 0] = (i * 7) % 256
      for packet in stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
        container.mux(packet)
    for packet in stream.encode():
      container.mux(packet)


@pytest.mark.parametrize("suffix, codec", [(".mp4", "libx264"), (".webm", "libvpx-vp9"), (".mkv", "ffv1")])
def test_reads_containers(tmp_path, suffix, codec):
  path = tmp_path / f"clip{suffix}"
  _encode(path, 90, codec)  # 3.6 s at 25 fps -> 7.2 -> 6 frames
  clip = read_video(path)
  assert (clip.total_frames, clip.video_fps, len(clip.frames)) == (90, 25.0, 6)
  np.testing.assert_array_equal(clip.indices, [0, 18, 36, 53, 71, 89])
  assert clip.fps == 6 / 90 * 25.0  # the sampled rate; second_per_grid_ts = 2 / clip.fps
  np.testing.assert_allclose(clip.timestamps, clip.indices / 25.0)
  red = clip.frames[..., 0].reshape(len(clip.frames), -1).mean(1)
  np.testing.assert_allclose(red, (clip.indices * 7) % 256, atol=3)  # lossy codecs: close, not exact
  # resized while decoding == decoded then resized
  cfg = VideoPreprocessConfig(min_pixels=28 * 28, max_pixels=2500)  # 48x64 -> 28x56
  small = read_video(path, cfg, resize=True)
  assert small.source_size == (48, 64) and small.frames.shape == (6, 28, 56, 3)
  np.testing.assert_array_equal(small.frames, resize_bicubic_aa(clip.frames, 28, 56))
  a, grid_a = preprocess_video(small, cfg)
  b, grid_b = preprocess_video(str(path), cfg)
  np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(grid_a, [3, 2, 4])


def test_sampling_options_and_errors(tmp_path):
  path = tmp_path / "clip.mp4"
  _encode(path, 40, "mpeg4", fps=10)
  assert len(read_video(path, nframes=8).frames) == 8
  assert len(read_video(path, fps=0.1).frames) == 4  # min_frames
  assert len(read_video(path, VideoPreprocessConfig(fps=5.0)).frames) == 20
  with pytest.raises(ValueError, match="does not exist"):
    read_video(tmp_path / "missing.mp4")
  (tmp_path / "bad.mp4").write_bytes(b"not a video")
  with pytest.raises(ValueError, match=r"record 'r7': cannot read video .*bad\.mp4"):
    read_video(tmp_path / "bad.mp4", record="r7")
