"""A saved Qwen3-VL (and Qwen3.5: the same processor, the hybrid decoder) HF checkpoint directory through jaxcap's inference entry points: `Sampler.from_checkpoint` (the
family, processor configs, chat template and weights all read from the directory) gives transformers' greedy
`generate` tokens for an image and a video prompt, and `python -m jaxcap.caption` on a folder gives each item's
caption as that sampler does alone."""

import json

import av
import jax
import numpy as np
import pytest
import torch
import transformers
from PIL import Image

from jaxcap import caption
from jaxcap.models.qwen35_presets import qwen35_tiny
from jaxcap.models.qwen3vl_presets import qwen3vl_tiny
from jaxcap.processing import read_video, word_tokenizer
from jaxcap.sampling import Sampler, SamplingConfig
from hf_reference import WORDS

STEPS = 6
# Qwen3-VL-*-Instruct's budgets (images >= 256 x 256 px; a whole clip >= 4096 px)
IMAGE = {"size": {"longest_edge": 16777216, "shortest_edge": 65536}, "patch_size": 16, "temporal_patch_size": 2}
IMAGE |= {"merge_size": 2, "image_mean": [0.5] * 3, "image_std": [0.5] * 3}
VIDEO = {**IMAGE, "size": {"longest_edge": 25165824, "shortest_edge": 4096}, "fps": 2, "min_frames": 4}
PROMPT = "describe the image in detail ."


FAMILIES = {  # family -> (tiny config, transformers config class, model class)
  "qwen3_vl": (qwen3vl_tiny, "Qwen3VLConfig", "Qwen3VLForConditionalGeneration"),
  "qwen3_5": (qwen35_tiny, "Qwen3_5Config", "Qwen3_5ForConditionalGeneration"),
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def setup(tmp_path_factory, request):
  """(checkpoint dir, transformers model, media folder) of each family."""
  root = tmp_path_factory.mktemp(f"{request.param}_ckpt")
  make, config_cls, model_cls = FAMILIES[request.param]
  cfg = make()
  torch.manual_seed(0)
  hc = getattr(transformers, config_cls)(**cfg.to_hf_dict())
  model = getattr(transformers, model_cls)(hc).float().eval()
  with torch.no_grad():  # non-trivial norms, so every weight matters
    for name, p in model.named_parameters():
      if "norm" in name and name.endswith("weight"):
        p.add_(0.1 * torch.randn_like(p))
  ckpt = root / "ckpt"
  model.save_pretrained(ckpt)
  word_tokenizer(WORDS, cfg).save_pretrained(ckpt)
  (ckpt / "preprocessor_config.json").write_text(json.dumps(IMAGE))
  (ckpt / "video_preprocessor_config.json").write_text(json.dumps(VIDEO))
  media = root / "media"
  media.mkdir()
  rng = np.random.RandomState(0)
  Image.fromarray((rng.rand(90, 170, 3) * 255).astype(np.uint8)).save(media / "wide.png")
  with av.open(str(media / "clip.mp4"), "w") as container:  # 12 frames at 4 fps: 6 sampled, 3 timestamps
    stream = container.add_stream("mpeg4", rate=4)
    stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
    for _ in range(12):
      frame = av.VideoFrame.from_ndarray((rng.rand(48, 64, 3) * 255).astype(np.uint8), format="rgb24")
      container.mux(stream.encode(frame))
    container.mux(stream.encode())
  return ckpt, model, media


def _conversation(media, name, processor):
  path = media / name
  item = (
    {"type": "video", "video": read_video(path, processor.video_cfg, resize=True)}
    if name.endswith(".mp4")
    else {"type": "image", "image": str(path)}
  )
  return [{"role": "user", "content": [item, {"type": "text", "text": PROMPT}]}]


def _generate(model, batch) -> np.ndarray:
  """transformers' greedy tokens [B, STEPS] for a jaxcap batch (whose processor equals transformers',
  tests/processing/test_qwen3vl_processor.py)."""
  ids = torch.as_tensor(batch.input_ids, dtype=torch.long)
  types = torch.zeros_like(ids, dtype=torch.int)
  types[ids == model.config.image_token_id] = 1
  types[ids == model.config.video_token_id] = 2
  kw = dict(input_ids=ids, attention_mask=torch.as_tensor(batch.attention_mask, dtype=torch.long))
  kw["mm_token_type_ids"] = types
  if batch.image_grid_thw is not None:
    kw["pixel_values"] = torch.as_tensor(batch.pixel_values)
    kw["image_grid_thw"] = torch.as_tensor(batch.image_grid_thw)
  if batch.video_grid_thw is not None:
    kw["pixel_values_videos"] = torch.as_tensor(batch.pixel_values)
    kw["video_grid_thw"] = torch.as_tensor(batch.video_grid_thw)
  with torch.no_grad():
    out = model.generate(**kw, max_new_tokens=STEPS, do_sample=False)
  return out[:, ids.shape[1] :].numpy()


@pytest.fixture(scope="module")
def sampler(setup):
  ckpt, _, _ = setup
  return Sampler.from_checkpoint(ckpt, sampling=SamplingConfig(temperature=0, max_new_tokens=STEPS))


@pytest.mark.parametrize("name", ["wide.png", "clip.mp4"])
def test_from_checkpoint_greedy_equals_transformers_generate(setup, sampler, name):
  ckpt, model, media = setup
  proc = sampler.processor
  # the family from config.json
  assert type(sampler.cfg).__name__ == type(model.config).__name__.replace("_", "")
  assert proc.system is None
  conv = _conversation(media, name, proc)
  batch = proc([conv], padding_side="left")
  if name.endswith(".mp4"):  # the clip's timestamps are in the prompt: 3 frame groups, 3 vision blocks, no outer one
    assert batch.video_grid_thw.tolist() == [[3, 4, 4]]
    start = proc.tokenizer.convert_tokens_to_ids("<|vision_start|>")
    assert (batch.input_ids[0] == start).sum() == 3
  want = _generate(model, batch)
  assert want.shape == (1, STEPS)  # no early end: every step compared
  got = sampler([conv], jax.random.key(0))
  np.testing.assert_array_equal(np.asarray(got.tokens)[:, :STEPS], want)


@pytest.mark.slow
def test_caption_cli_on_a_checkpoint(setup, sampler, tmp_path):
  """`jaxcap.caption` on a folder holding an image and a clip: each caption is the sampler's for that item alone."""
  ckpt, _, media = setup
  out = tmp_path / "captions.jsonl"
  args = ["--checkpoint", str(ckpt), "--images", str(media), "--out", str(out), "--batch_size", "2"]
  assert caption.main([*args, "--max_new_tokens", str(STEPS), "--prompt", PROMPT, "--no_progress"]) == 0
  rows = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
  assert sorted(rows) == ["clip.mp4", "wide.png"]
  for name, row in rows.items():
    alone = sampler([_conversation(media, name, sampler.processor)], jax.random.key(0))
    assert row["caption"] == alone.text[0], name
