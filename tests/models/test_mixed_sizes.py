"""Batches of images of many native sizes, a video and a text-only row, padded to shape buckets: every real row's
logits equal `transformers` run on that item alone (f32, through a saved HF checkpoint), greedy generation is
token-equal, padding never reaches a real image's features, and batches of other sizes in the same bucket reuse
the compiled programs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import jaxcap.models as M
from jaxcap.checkpoint import load_hf_checkpoint
from jaxcap.models.qwen25vl import VisionInput
from jaxcap.models.vision import LayoutShape, layout_shape, vision_layout
from jaxcap.processing import Processor
from jaxcap.sampling import TRACE_COUNTS, Sampler, SamplingConfig, bucket_prompts
from hf_reference import hf_inputs, save_tiny_checkpoint

NEW = 8


def _image(seed, h, w):
  return (np.random.RandomState(seed).rand(h, w, 3) * 255).astype(np.uint8)


def _user(*items):
  content = []
  for it in items:
    if isinstance(it, str):
      content.append({"type": "text", "text": it})
    elif isinstance(it, list):
      content.append({"type": "video", "video": it, "fps": 1.0})
    else:
      content.append({"type": "image", "image": it})
  return [{"role": "user", "content": content}]


# three image sizes (one spanning several attention windows), a 5-frame video and a text-only row
BATCH = [
  _user(_image(1, 56, 84), "describe the image ."),
  _user([_image(10 + i, 84, 56) for i in range(5)], "describe ."),
  _user(_image(2, 140, 112), "what colour is the large triangle ?"),
  _user("a red square on the left"),
  _user(_image(3, 196, 252), "describe the image in detail ."),
]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  cfg = M.tiny()
  directory = tmp_path_factory.mktemp("mixed")
  ref = save_tiny_checkpoint(cfg, 0, directory)
  return ref, load_hf_checkpoint(directory), Processor.from_pretrained(directory)


def _device(prompts):
  vision = prompts.vision
  return (
    jnp.asarray(prompts.input_ids),
    jnp.asarray(prompts.positions),
    jnp.asarray(prompts.attention_mask),
    None if vision is None else VisionInput(jnp.asarray(vision.pixel_values), jax.tree.map(jnp.asarray, vision.layout)),
  )


def test_bucketed_mixed_batch_logits_equal_each_item_alone(models):
  ref, model, proc = models
  inputs = proc(BATCH, padding_side="left")
  prompts, rows, items = bucket_prompts(inputs, proc.cfg, length_multiple=16)
  assert rows == 5 and prompts.batch == 8 and len({tuple(g) for g in inputs.grid_thw.tolist()}) == 4
  assert prompts.vision.pixel_values.shape[0] > inputs.pixel_values.shape[0] + 3 * 4  # padding of its own, too
  logits, _ = jax.jit(lambda *a: model(*a))(*_device(prompts))
  for i, conversation in enumerate(BATCH):
    alone = proc([conversation], padding_side="left")
    with torch.no_grad():
      want = ref(**hf_inputs(alone, proc.cfg)).logits[0].numpy()
    got = np.asarray(logits[i, -want.shape[0] :])
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4, err_msg=f"row {i}")


def test_greedy_on_the_mixed_batch_equals_transformers_per_item(models):
  ref, model, proc = models
  eos = proc.cfg.eos_token_id
  sampler = Sampler(model, processor=proc, sampling=SamplingConfig(temperature=0, max_new_tokens=NEW))
  got = np.asarray(sampler(BATCH, jax.random.key(0)).tokens)
  for i, conversation in enumerate(BATCH):
    alone = proc([conversation], padding_side="left")
    with torch.no_grad():
      out = ref.generate(
        **hf_inputs(alone, proc.cfg),
        do_sample=False,
        max_new_tokens=NEW,
        eos_token_id=[eos],
        pad_token_id=proc.tokenizer.pad_token_id,
      )
    want = out[0, alone.input_ids.shape[1] :].numpy()
    np.testing.assert_array_equal(got[i, : len(want)], want, err_msg=f"row {i}")


def test_padding_never_reaches_real_features(models):
  """The tower's outputs for real items are bit-identical whatever the padding patches hold, and equal the
  unpadded layout's."""
  _, model, proc = models
  inputs = proc(BATCH, padding_side="left")
  cfg = proc.cfg.vision
  exact = layout_shape(inputs.grid_thw, cfg)
  shape = LayoutShape(exact.patches + 96, exact.windows + 5, exact.window_len, exact.frames + 3, exact.frame_len + 8)
  padded = vision_layout(inputs.grid_thw, cfg, shape)
  real = inputs.pixel_values.shape[0]
  tower = jax.jit(lambda px, lay: model.visual(px, lay))
  noise = np.random.RandomState(0).randn(shape.patches - real, inputs.pixel_values.shape[1]).astype(np.float32)
  a = np.asarray(tower(np.concatenate([inputs.pixel_values, 0 * noise]), padded))[: real // 4]
  b = np.asarray(tower(np.concatenate([inputs.pixel_values, 1e3 * noise]), padded))[: real // 4]
  np.testing.assert_array_equal(a, b)
  want = np.asarray(tower(inputs.pixel_values, inputs.layout))
  np.testing.assert_allclose(a, want, atol=1e-5, rtol=1e-5)


def test_other_sizes_in_the_same_bucket_reuse_the_programs(models):
  _, model, proc = models
  sampler = Sampler(model, processor=proc, sampling=SamplingConfig(temperature=0, max_new_tokens=4))
  batch = lambda sides: [_user(_image(s, h, w), "describe .") for s, (h, w) in enumerate(sides)]
  first, second = batch([(56, 84), (112, 112), (84, 140), (56, 56)]), batch([(56, 56), (140, 84), (112, 112), (84, 56)])
  shapes = [bucket_prompts(proc(b, padding_side="left"), proc.cfg)[0] for b in (first, second)]
  assert shapes[0].vision.layout.windows.gather.shape == shapes[1].vision.layout.windows.gather.shape
  assert shapes[0].vision.pixel_values.shape == shapes[1].vision.pixel_values.shape
  assert not np.array_equal(shapes[0].vision.layout.window_index, shapes[1].vision.layout.window_index)
  sampler(first, jax.random.key(0))
  before = dict(TRACE_COUNTS)
  sampler(second, jax.random.key(1))  # other sizes in another order, one bucket
  assert dict(TRACE_COUNTS) == before, "a batch of other image sizes in the same bucket recompiled"
