"""`Processor` for a Qwen3-VL checkpoint equals transformers' `Qwen3VLProcessor` (its PIL image processor and
`Qwen3VLVideoProcessor`, built from the same local configs): pixel values, grids, input ids with the video
timestamps `<t seconds>` and the per-frame-group vision blocks, and the mRoPE positions equal
`Qwen3VLModel.get_rope_index` run on transformers' own processor outputs.

Two checkpoints: "hub" holds the image / video processor configs Qwen3-VL-{2B,4B,8B}-Instruct ship (size
{shortest_edge, longest_edge} budgets; the clip budget unset per frame), "tight" small budgets that bind (top-level
min / max pixels for images; a per-frame cap, fps 1.5 and an odd max_frames for video)."""

import json

import av
import numpy as np
import pytest
import torch
import transformers
from PIL import Image

from jaxcap.models.qwen3vl_presets import qwen3vl_tiny
from jaxcap.processing import Processor, Qwen3VideoPreprocessConfig, read_video, render_chat, word_tokenizer
from jaxcap.processing.chat import group_timestamps
from jaxcap.processing.tokenizer import encode_text
from jaxcap.processing.video_frames import video_file_grid
from hf_processor_reference import run_reference
from hf_reference import WORDS
from test_processor_parity import _encode_clip, _smooth

# Qwen/Qwen3-VL-*-Instruct's preprocessor_config.json and video_preprocessor_config.json (the values that matter)
HUB_IMAGE = {"size": {"longest_edge": 16777216, "shortest_edge": 65536}, "patch_size": 16, "temporal_patch_size": 2}
HUB_IMAGE |= {"merge_size": 2, "image_mean": [0.5] * 3, "image_std": [0.5] * 3, "resample": 3}
HUB_IMAGE |= {"image_processor_type": "Qwen2VLImageProcessorFast", "processor_class": "Qwen3VLProcessor"}
HUB_VIDEO = {k: v for k, v in HUB_IMAGE.items() if k not in ("size", "image_processor_type")}
HUB_VIDEO |= {"size": {"longest_edge": 25165824, "shortest_edge": 4096}, "fps": 2, "min_frames": 4, "max_frames": 768}
HUB_VIDEO |= {"do_sample_frames": True, "return_metadata": False, "video_processor_type": "Qwen3VLVideoProcessor"}
# Images: >= 8 and <= 40 merged 32x32 blocks. Video: 663 / 25 * 1.5 = 39 frames -> max_frames 15 (odd: the last is
# repeated); each frame max(min(2 tokens, 40 blocks / 15), 1.05 * 4096 px) = 4300 px -> 32x64.
TIGHT_IMAGE = {**HUB_IMAGE, "min_pixels": 32 * 32 * 8, "max_pixels": 32 * 32 * 40}
TIGHT_VIDEO = {**HUB_VIDEO, "size": {"shortest_edge": 4096, "longest_edge": 32 * 32 * 40}, "fps": 1.5}
TIGHT_VIDEO |= {"max_frames": 15, "cap_pixels_per_frame": True, "max_video_tokens": 2}
CONFIGS = {"hub": (HUB_IMAGE, HUB_VIDEO), "tight": (TIGHT_IMAGE, TIGHT_VIDEO)}

PROMPT = {"type": "text", "text": "describe the image in detail ."}
CLIP_FRAMES = 663  # 26.5 s at 25 fps
VOCAB = [*WORDS, "<", ">", "seconds", *map(str, range(100))]  # timestamps are words of the tokenizer


def _images(d):
  """name -> (path, how transformers is given it): odd sizes, an EXIF rotation, transparency (file and array)."""
  out = {}

  def save(name, image, how="path", **kw):
    image.save(d / name, **kw)
    out[name.split(".")[0]] = (str(d / name), how)

  save("large.png", Image.fromarray(_smooth(301, 403, 3, 0)))
  save("small.png", Image.fromarray(_smooth(30, 41, 3, 1)))
  save("odd.png", Image.fromarray(_smooth(123, 457, 3, 2)))  # 1:3.7, neither side a multiple of 32
  exif = Image.Exif()
  exif[0x0112] = 6  # rotate 90 degrees clockwise to display
  save("exif.jpg", Image.fromarray(_smooth(70, 150, 3, 3)), exif=exif.tobytes(), quality=95)
  rgba = _smooth(60, 81, 4, 4).copy()
  rgba[..., 3] = np.linspace(0, 255, 81)[None].astype(np.uint8)
  rgba[:20, :30, 3] = 0
  save("rgba.png", Image.fromarray(rgba, "RGBA"), how="pil")
  np.save(d / "rgba_array.npy", rgba)
  out["rgba_array"] = (str(d / "rgba_array.npy"), "array")
  return out


def _all_frames(path) -> np.ndarray:
  with av.open(str(path)) as container:
    return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(container.streams.video[0])])


IMAGE_CASES = ["large", "small", "odd", "exif", "rgba", "rgba_array"]
CASES = [*IMAGE_CASES, "two_images", "clip_25fps", "small_frames", "image_and_clip", "system_and_turns"]


def _checkpoint(d, name):
  """A Qwen3-VL checkpoint directory with no weights: config.json, a word tokenizer, the processor configs."""
  ckpt = d / name
  cfg = qwen3vl_tiny()
  transformers.Qwen3VLConfig(**cfg.to_hf_dict()).save_pretrained(ckpt)
  word_tokenizer(VOCAB, cfg).save_pretrained(ckpt)
  image, video = CONFIGS[name]
  (ckpt / "preprocessor_config.json").write_text(json.dumps(image))
  (ckpt / "video_preprocessor_config.json").write_text(json.dumps(video))
  return ckpt


@pytest.fixture(scope="module")
def world(tmp_path_factory):
  """name -> (our processor, conversations, transformers' outputs per case), and the reference model."""
  d = tmp_path_factory.mktemp("qwen3vl_processor")
  images = _images(d)
  _encode_clip(d / "clip.mp4", CLIP_FRAMES)
  np.save(d / "clip_all.npy", _all_frames(d / "clip.mp4"))
  clip_ref = {"frames": str(d / "clip_all.npy"), "total_num_frames": CLIP_FRAMES, "fps": 25.0, "indices": None}
  clip_ref["sample"] = True  # transformers samples the frames itself
  small = np.stack([_smooth(20, 50, 3, 10 + i) for i in range(5)])  # below 32 px high: scaled up first; odd count
  np.save(d / "small.npy", small)
  small_ref = {"frames": str(d / "small.npy"), "total_num_frames": 5, "fps": 1.0, "indices": list(range(5))}

  def image_item(name):
    path, how = images[name]
    return {"type": "image", "image": np.load(path) if how == "array" else path}

  convs, spec = {}, []
  for name in CASES:
    if name in images:
      conv = [{"role": "user", "content": [image_item(name), PROMPT]}]
      media, videos = [name], []
    elif name == "two_images":
      conv = [
        {"role": "user", "content": [image_item("exif"), {"type": "text", "text": "and"}, image_item("odd"), PROMPT]}
      ]
      media, videos = ["exif", "odd"], []
    elif name == "clip_25fps":
      conv = [{"role": "user", "content": [{"type": "video", "video": str(d / "clip.mp4")}, PROMPT]}]
      media, videos = [], [clip_ref]
    elif name == "small_frames":
      conv = [{"role": "user", "content": [{"type": "video", "video": list(small), "fps": 1.0}, PROMPT]}]
      media, videos = [], [small_ref]
    elif name == "image_and_clip":
      content = [image_item("small"), {"type": "text", "text": "then"}, {"type": "video", "video": str(d / "clip.mp4")}]
      conv = [{"role": "user", "content": [*content, PROMPT]}]
      media, videos = ["small"], [clip_ref]
    else:  # system_and_turns: a system turn of its own, an answered turn, a second question
      conv = [
        {"role": "system", "content": "a red square ."},
        {"role": "user", "content": [image_item("small"), PROMPT]},
        {"role": "assistant", "content": "a blue circle on the left ."},
        {"role": "user", "content": "and the right ?"},
      ]
      media, videos = ["small"], []
    convs[name] = conv
    images_spec = [{"path": images[i][0], "as": images[i][1]} for i in media]
    spec.append({"name": name, "text": render_chat(conv, system=None), "images": images_spec, "videos": videos})
  ckpts = {name: _checkpoint(d, name) for name in CONFIGS}
  cases = [{**c, "name": f"{name}-{c['name']}", "checkpoint": str(ckpts[name])} for name in CONFIGS for c in spec]
  hf = run_reference({"processor": "qwen3_vl", "cases": cases}, d)
  out = {}
  for name, ckpt in ckpts.items():
    out[name] = (Processor.from_pretrained(ckpt), convs, {c: hf[f"{name}-{c}"] for c in CASES})
  hc = transformers.Qwen3VLConfig(**qwen3vl_tiny().to_hf_dict())
  return out, transformers.Qwen3VLModel(hc).eval()


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("case", CASES)
def test_processor_equals_transformers(world, config, case):
  out, ref = world
  proc, convs, hf = out[config]
  want = hf[case]
  got = proc([convs[case]])
  np.testing.assert_array_equal(got.input_ids, want["input_ids"], err_msg=str(want["text"]))
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
  else:
    assert got.video_grid_thw is None
  t = lambda k: torch.as_tensor(want[k]) if k in want else None
  pos, deltas = ref.get_rope_index(
    t("input_ids"), t("mm_token_type_ids"), t("image_grid_thw"), t("video_grid_thw"), t("attention_mask")
  )
  np.testing.assert_array_equal(got.positions, pos.numpy())
  np.testing.assert_array_equal(got.rope_deltas, deltas.numpy().reshape(-1))


def test_cases_exercise_what_they_claim(world):
  """The budgets bind, the EXIF rotation and the upscaling of small frames take effect, the clip is sampled by
  transformers' rule (not qwen-vl-utils'), and its timestamps are in the ids."""
  out, _ = world
  grid = lambda config, case, key="image_grid_thw": tuple(out[config][2][case][key][0])
  assert grid("hub", "small")[1] * grid("hub", "small")[2] >= 65536 // 256  # the Hub minimum: >= 256 patches
  assert grid("tight", "large") == (1, 10, 14)  # 301x403 -> 160x224 <= 40 blocks of 32x32
  assert grid("tight", "small") == (1, 6, 8)  # 30x41 -> 96x128 >= 8 blocks
  assert grid("hub", "exif")[1] > grid("hub", "exif")[2]  # 150 wide, displayed rotated: taller than wide
  # 663 frames at 25 fps, fps 2: int(53.04) = 53 frames (qwen-vl-utils would take 52), padded to 27 groups; 48x64
  # -> 64x64 under the Hub's clip budget. Tight: 15 frames -> 8 groups of 32x64 (2 merged tokens each).
  assert grid("hub", "clip_25fps", "video_grid_thw") == (27, 4, 4)
  assert grid("tight", "clip_25fps", "video_grid_thw") == (8, 2, 4)
  assert grid("hub", "small_frames", "video_grid_thw") == (3, 2, 4)  # 20x50 -> 32x80 -> 32x64; 5 frames -> 3
  proc, convs, _ = out["hub"]
  clip = convs["clip_25fps"][0]["content"][0]["video"]
  assert video_file_grid(clip, proc.video_cfg) == (27, 4, 4)  # from the headers, before decoding
  assert isinstance(proc.video_cfg, Qwen3VideoPreprocessConfig) and proc.system is None
  times = group_timestamps(read_video(clip, proc.video_cfg).timestamps, 2)
  assert len(times) == 27 and f"{times[0]:.1f} {times[-1]:.1f}" == "0.3 26.5"
  ids = proc([convs["clip_25fps"]]).input_ids[0].tolist()
  for t in (times[0], times[-1]):
    stamp = encode_text(proc.tokenizer, f"<{t:.1f} seconds>")
    assert proc.tokenizer.unk_token_id not in stamp
    assert any(ids[i : i + len(stamp)] == stamp for i in range(len(ids)))


def test_template_is_qwen3_vl_s(world):
  """jaxcap renders Qwen3-VL's chat template: the non-tool branch of Qwen3-VL-*-Instruct's chat_template.json
  (restated below) — no system turn unless the conversation has one, text-only system / assistant turns, images
  and videos as <|vision_start|><|image_pad|><|vision_end|> / <|video_pad|> in user turns."""
  template = (
    "{%- if messages[0].role == 'system' %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].content is string %}{{- messages[0].content }}{%- else %}"
    "{%- for c in messages[0].content %}{%- if 'text' in c %}{{- c.text }}{%- endif %}{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- for m in messages %}{%- if m.role == 'user' or m.role == 'assistant' %}"
    "{{- '<|im_start|>' + m.role + '\\n' }}"
    "{%- if m.content is string %}{{- m.content }}{%- else %}{%- for c in m.content %}"
    "{%- if m.role == 'user' and (c.type == 'image' or 'image' in c) %}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif m.role == 'user' and (c.type == 'video' or 'video' in c) %}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{%- elif 'text' in c %}{{- c.text }}{%- endif %}{%- endfor %}{%- endif %}{{- '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
  )
  out, _ = world
  proc, convs, _ = out["hub"]
  for conv in convs.values():
    plain = [
      {
        **m,
        "content": m["content"]
        if isinstance(m["content"], str)
        else [{k: v for k, v in item.items() if k in ("type", "text")} for item in m["content"]],
      }
      for m in conv
    ]
    for gen in (True, False):
      want = proc.tokenizer.apply_chat_template(
        plain, chat_template=template, tokenize=False, add_generation_prompt=gen
      )
      assert render_chat(conv, gen, proc.system) == want
