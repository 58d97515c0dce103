"""Parity of the Flax Qwen2.5-VL with `transformers` (f32, CPU) on tiny random models built offline."""

import numpy as np
import pytest
import torch
import jax.numpy as jnp
from PIL import Image

import jaxcap.models as M
from jaxcap.checkpoint import load_hf_checkpoint
from jaxcap.processing import Processor
from hf_reference import hf_inputs, save_tiny_checkpoint

ATOL = 1e-4


def _image(seed, h, w):
  return (np.random.RandomState(seed).rand(h, w, 3) * 255).astype(np.uint8)


def _conversations(kind):
  img = lambda s, h, w: {"type": "image", "image": _image(s, h, w)}
  txt = lambda t: {"type": "text", "text": t}
  if kind == "square":
    return [[{"role": "user", "content": [img(1, 84, 84), txt("describe the image in detail .")]}]]
  if kind == "non_square":
    return [[{"role": "user", "content": [img(2, 70, 150), txt("what colour is the circle ?")]}]]
  if kind == "two_images":
    return [[{"role": "user", "content": [img(3, 56, 112), txt("and"), img(4, 112, 84), txt("describe .")]}]]
  if kind == "video":
    frames = [_image(10 + i, 84, 112) for i in range(5)]  # odd count: last frame repeated to fill a patch
    return [[{"role": "user", "content": [{"type": "video", "video": frames, "fps": 1.0}, txt("describe .")]}]]
  if kind == "text":
    return [[{"role": "user", "content": [txt("what shape is on the left of the red square ?")]}]]
  if kind == "padded_batch":
    return [
      [{"role": "user", "content": [img(5, 56, 56), txt("describe the image .")]}],
      [{"role": "user", "content": [img(6, 112, 140), txt("what colour is the large triangle on the top left ?")]}],
      [{"role": "user", "content": [txt("a red square")]}],
    ]
  raise KeyError(kind)


@pytest.fixture(scope="module", params=[0, 1], ids=["seed0", "seed1"])
def models(request, tmp_path_factory):
  cfg = M.tiny()
  directory = tmp_path_factory.mktemp(f"ckpt{request.param}")
  ref = save_tiny_checkpoint(cfg, request.param, directory)
  ours = load_hf_checkpoint(directory)
  return ref, ours, Processor.from_pretrained(directory)


KINDS = ["square", "non_square", "two_images", "video", "text", "padded_batch"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("side", ["left", "right"])
def test_position_ids_equal_get_rope_index(models, kind, side):
  ref, _, proc = models
  batch = proc(_conversations(kind), padding_side=side)
  kw = hf_inputs(batch, proc.cfg)
  pos, deltas = ref.model.get_rope_index(
    kw["input_ids"],
    kw["mm_token_type_ids"],
    kw.get("image_grid_thw"),
    kw.get("video_grid_thw"),
    kw.get("second_per_grid_ts"),
    kw["attention_mask"],
  )
  np.testing.assert_array_equal(batch.positions, pos.numpy())
  np.testing.assert_array_equal(batch.rope_deltas, deltas.numpy()[:, 0])


@pytest.mark.parametrize("kind", ["square", "non_square", "two_images", "video", "padded_batch"])
def test_vision_features_match(models, kind):
  ref, ours, proc = models
  batch = proc(_conversations(kind))
  with torch.no_grad():
    want = ref.model.visual(torch.as_tensor(batch.pixel_values), grid_thw=torch.as_tensor(batch.grid_thw))
  got = ours.visual(jnp.asarray(batch.pixel_values), batch.layout)
  np.testing.assert_allclose(np.asarray(got), want.pooler_output.numpy(), atol=ATOL, rtol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_logits_match(models, kind):
  ref, ours, proc = models
  batch = proc(_conversations(kind), padding_side="left")
  with torch.no_grad():
    want = ref(**hf_inputs(batch, proc.cfg), position_ids=torch.as_tensor(batch.positions, dtype=torch.long))
  got, _ = ours(
    jnp.asarray(batch.input_ids), jnp.asarray(batch.positions), jnp.asarray(batch.attention_mask), batch.vision()
  )
  valid = batch.attention_mask
  np.testing.assert_allclose(np.asarray(got)[valid], want.logits.numpy()[valid], atol=ATOL, rtol=0)


def test_logits_match_when_reference_computes_its_own_positions(models):
  """No position ids given to transformers: it derives them itself (unpadded image prompt)."""
  ref, ours, proc = models
  batch = proc(_conversations("two_images"))
  with torch.no_grad():
    want = ref(**hf_inputs(batch, proc.cfg)).logits.numpy()
  got, _ = ours(
    jnp.asarray(batch.input_ids), jnp.asarray(batch.positions), jnp.asarray(batch.attention_mask), batch.vision()
  )
  np.testing.assert_allclose(np.asarray(got), want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("size", [(84, 84), (70, 150), (500, 333), (30, 40)])
def test_image_preprocessing_equals_hf_processor(size):
  from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
  from jaxcap.processing import preprocess_image, VisionPreprocessConfig

  image = Image.fromarray(_image(7, *size))
  vcfg = VisionPreprocessConfig(max_pixels=28 * 28 * 64)
  hf = Qwen2VLImageProcessorPil(min_pixels=vcfg.min_pixels, max_pixels=vcfg.max_pixels)(image, return_tensors="np")
  patches, grid = preprocess_image(image, vcfg)
  np.testing.assert_array_equal(grid[None], hf["image_grid_thw"])
  np.testing.assert_allclose(patches, hf["pixel_values"], atol=1e-6, rtol=0)
