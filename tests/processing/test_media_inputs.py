"""Processor configs read as transformers reads them, oversized images rejected with a message naming the file
(and record) and the fix, and video files in manifests and training conversations."""

import json
import struct
import zlib

import av
import numpy as np
import pytest
from PIL import Image

import jaxcap.models as M
from jaxcap.data.manifest import ManifestError, read_manifest
from jaxcap.data.records import ImageRecord
from jaxcap.processing import (
  Processor,
  VideoClip,
  VideoPreprocessConfig,
  VisionPreprocessConfig,
  load_image,
  preprocess_image,
  read_image_size,
  word_tokenizer,
)
from jaxcap.train.rollouts import loader as data_lib

CFG = M.tiny()


def _write(d, name, row):
  (d / name).write_text(json.dumps(row))


def test_image_config_as_transformers_reads_it(tmp_path):
  from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

  for row in (
    {"size": {"shortest_edge": 1000, "longest_edge": 50_000}},
    {"size": {"shortest_edge": 1000, "longest_edge": 50_000}, "min_pixels": 2000, "max_pixels": 90_000},
    {"min_pixels": 3136, "max_pixels": 12_845_056},  # the released Qwen2.5-VL Instruct checkpoints
    {},
  ):
    _write(tmp_path, "preprocessor_config.json", row)
    ours = VisionPreprocessConfig.from_pretrained(tmp_path)
    hf = Qwen2VLImageProcessorPil.from_pretrained(tmp_path)
    assert (ours.min_pixels, ours.max_pixels) == (hf.size.shortest_edge, hf.size.longest_edge), row
  # transformers v5 nests processor settings in processor_config.json, which wins
  _write(tmp_path, "processor_config.json", {"image_processor": {"max_pixels": 28 * 28 * 9}})
  assert VisionPreprocessConfig.from_pretrained(tmp_path).max_pixels == 28 * 28 * 9


def test_normalisation_from_config_equals_transformers(tmp_path):
  from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

  row = {"min_pixels": 784, "max_pixels": 28 * 28 * 6, "image_mean": [0.5, 0.4, 0.3], "image_std": [0.2, 0.3, 0.4]}
  row |= {"rescale_factor": 1 / 127.5, "resample": 2}
  _write(tmp_path, "preprocessor_config.json", row)
  image = Image.fromarray((np.random.RandomState(0).rand(70, 90, 3) * 255).astype(np.uint8))
  hf = Qwen2VLImageProcessorPil.from_pretrained(tmp_path)(image, return_tensors="np")
  patches, grid = preprocess_image(image, VisionPreprocessConfig.from_pretrained(tmp_path))
  np.testing.assert_array_equal(grid[None], hf["image_grid_thw"])
  np.testing.assert_array_equal(patches, hf["pixel_values"])


def test_video_config_priority_and_fallbacks(tmp_path):
  assert VideoPreprocessConfig.from_pretrained(tmp_path).max_pixels == VisionPreprocessConfig().max_pixels
  _write(tmp_path, "preprocessor_config.json", {"min_pixels": 3136, "max_pixels": 12_845_056})
  video = VideoPreprocessConfig.from_pretrained(tmp_path)  # transformers reads the image file when alone
  assert (video.min_pixels, video.max_pixels, video.fps, video.cap_pixels_per_frame) == (3136, 12_845_056, 2.0, True)
  assert video.frame_max_pixels(100) == int(128_000 * 28 * 28 * 0.9) * 2 // 100  # the clip budget binds
  _write(tmp_path, "video_preprocessor_config.json", {"fps": 1.0, "max_frames": 64, "cap_pixels_per_frame": False})
  video = VideoPreprocessConfig.from_pretrained(tmp_path)
  assert (video.min_pixels, video.max_pixels) == (128 * 28 * 28, 768 * 28 * 28)  # the video class defaults
  assert (video.fps, video.max_frames, video.frame_max_pixels(100)) == (1.0, 64, 768 * 28 * 28)


def test_processor_rejects_configs_of_another_geometry(tmp_path):
  with pytest.raises(ValueError, match=r"\(patch_size, temporal_patch_size, merge_size\) = \(16, 2, 2\)"):
    Processor(word_tokenizer(["a"], CFG), CFG, VisionPreprocessConfig(patch_size=16))


def _header_only_png(path, width, height):
  """A PNG whose header claims width x height (nothing to decode): what a 20000 x 20000 scan looks like to open."""
  chunk = lambda kind, data: struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
  ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
  path.write_bytes(
    b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")
  )


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
def test_oversized_image_error_names_file_record_and_fix(tmp_path):
  huge = tmp_path / "scan.png"
  _header_only_png(huge, 20_000, 20_000)  # above Pillow's decompression-bomb guard
  with pytest.raises(ValueError) as e:
    load_image(huge)
  message = str(e.value)
  assert message.startswith(f"image {huge} is too large to decode") and "decompression-bomb" in message, message
  for fix in ("downscale the file", "drop it", "VisionPreprocessConfig.max_image_pixels", "PIL.Image.MAX_IMAGE_PIXELS"):
    assert fix in message, message
  big = tmp_path / "big.png"
  _header_only_png(big, 12_000, 8_000)  # above jaxcap's limit (Pillow only warns): rejected before decoding
  with pytest.raises(ValueError, match=r"image .*big\.png is too large to decode \(12000x8000 = 96,000,000 pixels, "):
    load_image(big)
  small = tmp_path / "small.png"
  Image.new("RGB", (300, 200)).save(small)
  with pytest.raises(ValueError, match=r"^record 'r7': image .*small\.png .*\(300x200 = 60,000 pixels, above 10,000\)"):
    load_image(small, max_image_pixels=10_000, record="r7")
  # the trainer's loader and the processor name the record / file
  with pytest.raises(ValueError, match=r"^record 'scan-1': image .*scan\.png is too large"):
    data_lib.conversation(ImageRecord(id="scan-1", image=str(huge)), "describe .", None)
  processor = Processor(word_tokenizer(["describe", "."], CFG), CFG)
  with pytest.raises(ValueError, match=r"image .*scan\.png is too large"):
    processor([[{"role": "user", "content": [{"type": "image", "image": str(huge)}]}]])
  (tmp_path / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 truncated")
  with pytest.raises(ValueError, match=r"^record 'b': cannot read image .*broken\.jpg"):
    data_lib.load_media(ImageRecord(id="b", image=str(tmp_path / "broken.jpg")), None)


def test_read_image_size_applies_exif_rotation(tmp_path):
  exif = Image.Exif()
  exif[0x0112] = 8
  Image.new("RGB", (90, 40)).save(tmp_path / "r.jpg", exif=exif.tobytes())
  assert read_image_size(tmp_path / "r.jpg") == (90, 40) == load_image(tmp_path / "r.jpg").size[::-1]


def _clip(path, frames=40, fps=10):
  with av.open(str(path), "w") as container:
    stream = container.add_stream("mpeg4", rate=fps)
    stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
    for i in range(frames):
      frame = np.full((48, 64, 3), (i * 5) % 256, np.uint8)
      for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
        container.mux(packet)
    for packet in stream.encode():
      container.mux(packet)


def test_video_files_in_manifests_and_conversations(tmp_path):
  (tmp_path / "clips").mkdir()
  _clip(tmp_path / "clips" / "a.mp4")
  Image.new("RGB", (60, 40), "red").save(tmp_path / "still.png")
  rows = [{"id": "v", "video": "clips/a.mp4", "reference_caption": "grey"}, {"id": "i", "image": "still.png"}]
  (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  video, still = read_manifest(tmp_path / "m.jsonl").records
  assert video.image == str(tmp_path / "clips" / "a.mp4") and video.is_video and not still.is_video
  assert ImageRecord.from_json(video.to_json()) == video  # written back as "image": readable by older readers
  with pytest.raises(ValueError, match="has 'video' and also 'image'"):
    ImageRecord.from_json({"id": "x", "video": "a.mp4", "image": "a.png"})

  processor = Processor(word_tokenizer(["describe", "."], CFG), CFG)
  conv = data_lib.conversation(video, "describe .", None, video_cfg=processor.video_cfg)
  item = conv[0]["content"][0]
  assert item["type"] == "video" and isinstance(item["video"], VideoClip) and item["record"] == "v"
  assert len(item["video"].frames) == 8  # 40 frames at 10 fps, sampled at 2 fps
  batch = processor([conv, data_lib.conversation(still, "describe .", None)])
  np.testing.assert_array_equal(batch.video_grid_thw, [[4, 4, 4]])  # 48x64 -> 56x56 within the image budget
  np.testing.assert_allclose(batch.second_per_grid_ts, [2 / (8 / 40 * 10)])
  square = data_lib.conversation(video, "describe .", 28, video_cfg=processor.video_cfg)[0]["content"][0]["video"]
  assert square.frames.shape == (8, 28, 28, 3)
  with pytest.raises(ValueError, match=r"^record 'gone': video .*missing\.mp4 does not exist"):
    data_lib.load_media(ImageRecord(id="gone", image=str(tmp_path / "missing.mp4")), None)
  with pytest.raises(ManifestError):
    (tmp_path / "bad.jsonl").write_text(json.dumps({"id": "x", "video": "a.mp4", "frames": ["f.png"]}) + "\n")
    read_manifest(tmp_path / "bad.jsonl")


def test_trainer_pixel_budget_overrides_the_checkpoints_where_set():
  import ml_collections

  from jaxcap.train.shell.setup import with_pixel_budget

  ckpt = VisionPreprocessConfig(min_pixels=3136, max_pixels=12845056)
  data = ml_collections.ConfigDict(dict(min_pixels=0, max_pixels=448 * 448))
  got = with_pixel_budget(ckpt, data)
  assert (got.min_pixels, got.max_pixels) == (3136, 448 * 448)
  t, h, w = got.grid(3000, 4000)  # a phone photo: native aspect, area within the budget
  assert h * w * 14 * 14 <= 448 * 448 and abs(w / h - 4 / 3) < 0.1 and ckpt.grid(3000, 4000)[1] > h
  assert with_pixel_budget(ckpt, ml_collections.ConfigDict(dict(min_pixels=0, max_pixels=0))) is ckpt
