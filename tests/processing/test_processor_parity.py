"""`Processor` outputs equal transformers' `Qwen2_5_VLProcessor` built from the same checkpoint configs:
pixel_values, grids, input_ids, second_per_grid_ts, and the mRoPE positions equal `get_rope_index` of a tiny
transformers model run on transformers' own processor outputs."""

import json

import av
import numpy as np
import pytest
import torch
from PIL import Image

import jaxcap.models as M
from jaxcap.processing import Processor, read_image_size, read_video, render_chat
from jaxcap.processing.video_frames import video_file_grid
from hf_processor_reference import run_reference
from hf_reference import save_tiny_checkpoint

# Non-default budgets: images are upscaled to >= 8 and downscaled to <= 40 merged 28x28 blocks; each video frame
# gets at most 16 blocks, and the whole clip 100 tokens' worth (0.9 * 100 * 28^2 px), which binds for 52 frames.
IMAGE_CONFIG = {"min_pixels": 28 * 28 * 8, "max_pixels": 28 * 28 * 40, "patch_size": 14, "temporal_patch_size": 2}
IMAGE_CONFIG |= {"merge_size": 2, "resample": 3, "image_processor_type": "Qwen2VLImageProcessor"}
VIDEO_CONFIG = {"size": {"shortest_edge": 28 * 28 * 2, "longest_edge": 28 * 28 * 16}, "cap_pixels_per_frame": True}
VIDEO_CONFIG |= {"max_video_tokens": 100, "fps": 2.0, "video_processor_type": "Qwen2VLVideoProcessor"}
PROMPT = {"type": "text", "text": "describe the image in detail ."}
CLIP_FRAMES = 663  # at 25 fps: 52 frames sampled, 26 temporal patches; float64 time ids would be off by one


def _smooth(h, w, channels, seed):
  """A smooth random image (resampling differences would show on it), uint8 [h, w, channels]."""
  rng = np.random.RandomState(seed)
  small = rng.rand(4, 4, channels) * 255
  return np.asarray(Image.fromarray(small.astype(np.uint8).squeeze()).resize((w, h), Image.Resampling.BICUBIC))


def _media(d):
  """Writes the test images; returns name -> (path, how transformers is given it)."""
  out = {}

  def save(name, image, how="path", **kw):
    path = d / name
    image.save(path, **kw)
    out[name.split(".")[0]] = (str(path), how)

  save("large.png", Image.fromarray(_smooth(300, 400, 3, 0)))  # above max_pixels: shrunk to the budget
  save("small.png", Image.fromarray(_smooth(30, 40, 3, 1)))  # below min_pixels: enlarged
  exif = Image.Exif()
  exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise to display
  save("exif.jpg", Image.fromarray(_smooth(64, 96, 3, 2)), exif=exif.tobytes(), quality=95)
  rgba = _smooth(60, 80, 4, 3).copy()
  rgba[..., 3] = np.linspace(0, 255, 80)[None].astype(np.uint8)  # transparent on the left, opaque on the right
  rgba[:20, :30, 3] = 0
  save("rgba.png", Image.fromarray(rgba, "RGBA"), how="pil")
  la = np.stack([_smooth(50, 70, 1, 4), rgba[:50, :70, 3]], -1)
  save("la.png", Image.fromarray(la, "LA"), how="pil")
  palette = Image.fromarray(_smooth(50, 70, 3, 5)).quantize(16)
  save("palette_alpha.png", palette, how="pil", transparency=3)
  save("palette.png", palette)
  save("gray.png", Image.fromarray(_smooth(45, 70, 1, 6)))
  save("cmyk.jpg", Image.fromarray(_smooth(50, 60, 3, 7)).convert("CMYK"), quality=95)
  save("gray16.png", Image.fromarray((_smooth(40, 60, 1, 8).astype(np.uint16) * 4)))  # 0..1020: Pillow clips at 255
  np.save(d / "rgba_array.npy", rgba)
  out["rgba_array"] = (str(d / "rgba_array.npy"), "array")
  return out


def _encode_clip(path, frames, fps=25, size=(64, 48)):
  with av.open(str(path), "w") as container:
    stream = container.add_stream("mpeg4", rate=fps)
    stream.width, stream.height, stream.pix_fmt = *size, "yuv420p"
    for i in range(frames):
      img = np.zeros((size[1], size[0], 3), np.uint8)
      img[..., 0] = (i * 7) % 256
      img[..., 1] = (np.arange(size[0]) * 4)[None]
      img[i % size[1], :, 2] = 255
      for packet in stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
        container.mux(packet)
    for packet in stream.encode():
      container.mux(packet)


IMAGE_CASES = ["large", "small", "exif", "rgba", "la", "palette_alpha", "palette", "gray", "cmyk", "gray16"]
CASES = IMAGE_CASES + ["rgba_array", "two_images", "clip_25fps", "frame_list", "image_and_frames"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
  """(checkpoint dir, transformers model, our processor, our conversations, transformers' outputs) per case."""
  d = tmp_path_factory.mktemp("parity")
  ckpt = d / "ckpt"
  ref = save_tiny_checkpoint(M.tiny(), 0, ckpt)
  (ckpt / "preprocessor_config.json").write_text(json.dumps(IMAGE_CONFIG))
  (ckpt / "video_preprocessor_config.json").write_text(json.dumps(VIDEO_CONFIG))
  media = _media(d)
  _encode_clip(d / "clip.mp4", CLIP_FRAMES)
  clip = read_video(d / "clip.mp4")  # what both get: the frames qwen-vl-utils' rule samples, undecoded budget
  np.save(d / "clip.npy", clip.frames)
  frames = np.stack([_smooth(50, 66, 3, 10 + i) for i in range(5)])  # odd count: last frame repeated
  np.save(d / "frames.npy", frames)
  clip_ref = {"frames": str(d / "clip.npy"), "total_num_frames": clip.total_frames, "fps": clip.video_fps}
  clip_ref["indices"] = clip.indices.tolist()
  frames_ref = {"frames": str(d / "frames.npy"), "total_num_frames": 5, "fps": 1.0, "indices": None}

  def image_item(name):
    path, how = media[name]
    return {"type": "image", "image": np.load(path) if how == "array" else path}

  convs, spec = {}, []
  for name in CASES:
    if name in media:
      content, images, videos = [image_item(name), PROMPT], [name], []
    elif name == "two_images":
      content = [image_item("exif"), {"type": "text", "text": "and"}, image_item("rgba"), PROMPT]
      images, videos = ["exif", "rgba"], []
    elif name == "clip_25fps":
      content, images, videos = [{"type": "video", "video": str(d / "clip.mp4")}, PROMPT], [], [clip_ref]
    elif name == "frame_list":
      content, images, videos = [{"type": "video", "video": list(frames), "fps": 1.0}, PROMPT], [], [frames_ref]
    else:  # image_and_frames
      content = [image_item("large"), {"type": "video", "video": frames, "fps": 1.0}, PROMPT]
      images, videos = ["large"], [frames_ref]
    conv = [{"role": "user", "content": content}]
    convs[name] = conv
    spec.append(
      {
        "name": name,
        "text": render_chat(conv),
        "images": [{"path": media[i][0], "as": media[i][1]} for i in images],
        "videos": videos,
      }
    )
  hf = run_reference({"checkpoint": str(ckpt), "cases": spec}, d)
  return ref, Processor.from_pretrained(ckpt), convs, hf


@pytest.mark.parametrize("case", CASES)
def test_processor_equals_transformers(world, case):
  ref, proc, convs, hf = world
  want = hf[case]
  got = proc([convs[case]])
  np.testing.assert_array_equal(got.input_ids, want["input_ids"])
  np.testing.assert_array_equal(got.attention_mask, want["attention_mask"].astype(bool))
  n_img = 0
  if "image_grid_thw" in want:
    np.testing.assert_array_equal(got.image_grid_thw, want["image_grid_thw"])
    n_img = len(want["pixel_values"])
    np.testing.assert_array_equal(got.pixel_values[:n_img], want["pixel_values"])
  else:
    assert got.image_grid_thw is None
  if "video_grid_thw" in want:
    np.testing.assert_array_equal(got.video_grid_thw, want["video_grid_thw"])
    np.testing.assert_array_equal(got.pixel_values[n_img:], want["pixel_values_videos"])
    assert got.second_per_grid_ts.dtype == want["second_per_grid_ts"].dtype == np.float32
    np.testing.assert_array_equal(got.second_per_grid_ts, want["second_per_grid_ts"])
  else:
    assert got.video_grid_thw is None
  # positions: transformers' get_rope_index on transformers' own processor outputs
  t = lambda k: torch.as_tensor(want[k]) if k in want else None
  pos, deltas = ref.model.get_rope_index(
    t("input_ids"),
    t("mm_token_type_ids"),
    t("image_grid_thw"),
    t("video_grid_thw"),
    t("second_per_grid_ts"),
    t("attention_mask"),
  )
  np.testing.assert_array_equal(got.positions, pos.numpy())
  np.testing.assert_array_equal(got.rope_deltas, deltas.numpy()[:, 0])


def test_cases_exercise_what_they_claim(world):
  """The budgets bind, the EXIF rotation and transparency take effect, and the long 25 fps clip is one where time
  ids computed in float64 (as jaxcap did) are off by one."""
  _, proc, convs, hf = world
  grid = lambda case: tuple(hf[case]["image_grid_thw"][0])
  assert grid("large") == (1, 10, 14)  # 300x400 -> 140x196 <= 40 blocks of 28x28
  assert grid("small") == (1, 6, 8)  # 30x40 -> 84x112 >= 8 blocks
  assert grid("exif")[1] > grid("exif")[2]  # 96 wide x 64 high, displayed rotated: taller than wide
  white = (1 - np.array([0.48145466, 0.4578275, 0.40821073])) / np.array([0.26862954, 0.26130258, 0.27577711])
  top_left = proc([convs["rgba"]]).pixel_values[0].reshape(3, 2, 14, 14)[:, 0, 0, 0]  # a transparent corner
  np.testing.assert_allclose(top_left, white, atol=1e-5)
  assert tuple(hf["clip_25fps"]["video_grid_thw"][0]) == (26, 2, 4)  # 52 frames; 28x56 under the clip budget
  # the grids bucketing can know before decoding: from headers
  assert proc.vision_cfg.grid(*read_image_size(convs["exif"][0]["content"][0]["image"])) == grid("exif")
  assert video_file_grid(convs["clip_25fps"][0]["content"][0]["video"], proc.video_cfg) == (26, 2, 4)
  spg = hf["clip_25fps"]["second_per_grid_ts"][0]
  float64_ids = (np.arange(26) * (2 * float(spg))).astype(np.int64)
  float32_ids = (np.arange(26, dtype=np.float32) * np.float32(2 * spg)).astype(np.int64)
  assert (float64_ids != float32_ids).any()
