"""Parity of the Flax Qwen3.5 with `transformers`' Qwen3_5ForConditionalGeneration (f32, CPU) on tiny random
models built offline, saved with `save_pretrained` and read back through `load_hf_checkpoint`: logits for single and
mixed images, video, left / right padding, tied / untied heads; greedy decoding through the hybrid cache equal to
`generate`; the export bit-exact both ways."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file

from jaxcap.checkpoint import load_hf_checkpoint, save_hf_checkpoint
from jaxcap.models.families import family_of_checkpoint
from jaxcap.models.qwen35 import HybridCache, Qwen35
from jaxcap.models.qwen35_config import Qwen35Config
from jaxcap.models.qwen35_presets import PRESETS, qwen35_tiny
from jaxcap.models.qwen3vl_vision import qwen3_vision_layout
from tests.models.vl_cases import case, greedy, hf_kwargs, our_inputs

ATOL = 1e-4
KINDS = ["single_image", "two_images", "text_only", "video", "mixed_batch"]


def _hf_model(cfg: Qwen35Config, seed: int):
  torch.manual_seed(seed)
  hc = transformers.Qwen3_5Config(**cfg.to_hf_dict())
  hc._attn_implementation = "eager"
  model = transformers.Qwen3_5ForConditionalGeneration(hc).float().eval()
  with torch.no_grad():  # norms start at 0 (zero-centred) or 1, biases at 0: perturb them so every param matters
    for name, p in model.named_parameters():
      if ("norm" in name and name.endswith("weight")) or name.endswith("dt_bias"):
        p.add_(0.1 * torch.randn_like(p))
      elif name.endswith("bias"):
        p.add_(0.02 * torch.randn_like(p))
  return model


def _load(tie: bool, tmp_path_factory):
  cfg = qwen35_tiny(tie=tie)
  directory = tmp_path_factory.mktemp(f"qwen35_{'tied' if tie else 'untied'}")
  ref = _hf_model(cfg, seed=int(tie))
  ref.save_pretrained(directory)
  return ref, load_hf_checkpoint(directory), directory


@pytest.fixture(scope="module")
def untied(tmp_path_factory):
  return _load(False, tmp_path_factory)


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
  return _load(True, tmp_path_factory)


@pytest.fixture(params=["untied", "tied"])
def models(request):
  return request.getfixturevalue(request.param)


@pytest.mark.parametrize(
  "kind,side,variant",
  [(k, "left", "untied") for k in KINDS] + [("mixed_batch", "right", "untied"), ("mixed_batch", "left", "tied")],
)
def test_logits_match(request, kind, side, variant):
  ref, ours, _ = request.getfixturevalue(variant)
  c = case(ours.cfg, kind, side)
  with torch.no_grad():
    want = ref(**hf_kwargs(ours.cfg, c)).logits.numpy()
  positions, vision = our_inputs(ours.cfg, c)
  got, _ = ours(jnp.asarray(c["ids"]), jnp.asarray(positions), jnp.asarray(c["mask"], bool), vision)
  valid = c["mask"].astype(bool)
  np.testing.assert_allclose(np.asarray(got)[valid], want[valid], atol=ATOL, rtol=0)


def test_vision_features_match(untied):
  ref, ours, _ = untied
  grid = np.array([[1, 4, 6], [1, 8, 4], [2, 4, 4]])
  px = np.random.RandomState(0).randn(int(np.prod(grid, -1).sum()), ours.cfg.vision.patch_dim).astype(np.float32)
  with torch.no_grad():
    want = ref.model.visual(torch.as_tensor(px), grid_thw=torch.as_tensor(grid))
  feats, deepstack = ours.visual(jnp.asarray(px), qwen3_vision_layout(grid, ours.cfg.vision))
  assert deepstack is None
  np.testing.assert_allclose(np.asarray(feats), want.pooler_output.numpy(), atol=ATOL, rtol=0)


def test_family_scan_and_unrolled_layers_agree(untied):
  """The checkpoint's family is qwen3_5; the blocks' scan, the unrolled layers and remat give the same logits."""
  _, ours, directory = untied
  assert family_of_checkpoint(directory).model_cls is Qwen35 and isinstance(ours, Qwen35)
  assert ours.block_period == 3
  c = case(ours.cfg, "two_images")
  positions, vision = our_inputs(ours.cfg, c)
  args = jnp.asarray(c["ids"]), jnp.asarray(positions), jnp.asarray(c["mask"], bool), vision
  want = np.asarray(ours(*args)[0])
  for overrides in (dict(scan_layers=False), dict(remat="full")):
    np.testing.assert_allclose(np.asarray(load_hf_checkpoint(directory, **overrides)(*args)[0]), want, atol=1e-5)


def test_hf_round_trip_is_bit_exact(models, tmp_path):
  ref, ours, directory = models
  save_hf_checkpoint(ours, tmp_path)
  original, exported = load_file(directory / "model.safetensors"), load_file(tmp_path / "model.safetensors")
  assert sorted(original) == sorted(exported)
  for k, v in exported.items():
    assert original[k].dtype == v.dtype and np.array_equal(original[k], v), k
  assert Qwen35Config.from_hf_dict(json.loads((tmp_path / "config.json").read_text())) == Qwen35Config.from_hf_dict(
    json.loads((directory / "config.json").read_text())
  )
  back, info = transformers.Qwen3_5ForConditionalGeneration.from_pretrained(tmp_path, output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"]
  theirs = back.state_dict()
  assert all(torch.equal(v, theirs[k]) for k, v in ref.state_dict().items())


@pytest.mark.parametrize("kind,variant", [("two_images", "untied"), ("mixed_batch", "tied")])
def test_greedy_generation_equals_transformers_generate(request, kind, variant):
  ref, ours, _ = request.getfixturevalue(variant)
  steps = 8
  c = case(ours.cfg, kind)
  with torch.no_grad():
    out = ref.generate(
      **hf_kwargs(ours.cfg, c), max_new_tokens=steps, do_sample=False, output_logits=True, return_dict_in_generate=True
    )
  want = out.sequences[:, c["ids"].shape[1] :].numpy()
  assert isinstance(ours.empty_cache(1, 2), HybridCache)  # attention KV and linear states, through `greedy`
  tokens, logits = greedy(ours, c, steps)
  assert want.shape == tokens.shape
  np.testing.assert_array_equal(tokens, want)
  np.testing.assert_allclose(logits, torch.stack(out.logits, 1).numpy(), atol=ATOL, rtol=0)


@pytest.mark.parametrize("preset", list(PRESETS))
def test_presets_round_trip_through_transformers_config(preset):
  cfg = PRESETS[preset]()
  assert Qwen35Config.from_hf_dict(transformers.Qwen3_5Config(**cfg.to_hf_dict()).to_dict()) == cfg
  assert 2 * sum(cfg.text.mrope_section) == cfg.text.rotary_dim
  assert cfg.vision.out_hidden_size == cfg.text.hidden_size and not cfg.vision.deepstack_visual_indexes


def test_config_errors_name_the_field():
  with pytest.raises(ValueError, match="qwen3_5"):
    Qwen35Config.from_hf_dict({"model_type": "qwen3_vl"})
  with pytest.raises(ValueError, match="layer_types"):
    qwen35_tiny().text.__class__(num_hidden_layers=2, layer_types=("linear_attention",))


def test_packed_rows_equal_each_sequence_alone(untied):
  """Two sequences (an image prompt and a text prompt) packed end to end in one row, with segment ids and each
  segment's own positions: the logits of each equal its own unpadded pass (attention within a segment; the linear
  layers' conv and state reset at the segment start)."""
  _, ours, _ = untied
  parts = [case(ours.cfg, "single_image"), case(ours.cfg, "text_only")]
  ids, positions, segments, pixels, grids, alone = [], [], [], [], [], []
  for s, c in enumerate(parts, start=1):
    pos, vision = our_inputs(ours.cfg, c)
    ids.append(c["ids"][0])
    positions.append(pos[:, 0])
    segments.append(np.full(c["ids"].shape[1], s, np.int32))
    if c["image_grid"] is not None:
      pixels.append(c["image_px"])
      grids.append(c["image_grid"])
    alone.append(np.asarray(ours(jnp.asarray(c["ids"]), jnp.asarray(pos), jnp.ones(c["ids"].shape, bool), vision)[0]))
  ids, positions, segments = np.concatenate(ids)[None], np.concatenate(positions, 1)[:, None], np.concatenate(segments)
  from jaxcap.models.qwen25vl import VisionInput

  vision = VisionInput(jnp.asarray(np.concatenate(pixels)), qwen3_vision_layout(np.concatenate(grids), ours.cfg.vision))
  x, _ = ours.embed_vision(jnp.asarray(ids), vision)
  real = jnp.ones(ids.shape, bool)
  hidden, _ = ours.decode(x, jnp.asarray(positions), real, segments=jnp.asarray(segments)[None])
  got = np.asarray(ours.logits(hidden))[0]
  n = alone[0].shape[1]
  np.testing.assert_allclose(got[:n], alone[0][0], atol=1e-4)
  np.testing.assert_allclose(got[n:], alone[1][0], atol=1e-4)


def test_lora_on_every_projection_loads_in_peft_with_the_same_logits(untied, tmp_path):
  """LoRA on the attention, MLP and linear-attention projections: zero adapters leave the logits bit for bit; the
  adapters alone, written in PEFT's layout, make peft's model on the transformers base compute jaxcap's logits."""
  peft = pytest.importorskip("peft")
  from flax import nnx

  from jaxcap.checkpoint.peft import save_peft_adapters
  from jaxcap.models import lora

  ref, ours, directory = untied
  c = case(ours.cfg, "single_image")
  positions, vision = our_inputs(ours.cfg, c)
  args = jnp.asarray(c["ids"]), jnp.asarray(positions), jnp.asarray(c["mask"], bool), vision
  base = np.asarray(ours(*args)[0])
  targets = lora.LORA_TARGETS + lora.LINEAR_ATTENTION_TARGETS
  model = lora.apply_lora(load_hf_checkpoint(directory), rank=4, alpha=8.0, seed=3, targets=targets)
  assert np.array_equal(np.asarray(model(*args)[0]), base)
  graphdef, params = nnx.split(model)
  rng = np.random.RandomState(7)
  params = jax.tree_util.tree_map_with_path(
    lambda p, x: x + 0.05 * rng.randn(*x.shape).astype(x.dtype) if "lora_b" in jax.tree_util.keystr(p) else x, params
  )
  model = nnx.merge(graphdef, params)
  got = np.asarray(model(*args)[0])
  out = save_peft_adapters(model, tmp_path / "adapters", base_model=str(directory))
  back = peft.PeftModel.from_pretrained(
    transformers.Qwen3_5ForConditionalGeneration.from_pretrained(directory, attn_implementation="eager").float(), out
  ).eval()
  adapted = {n for n, m in back.named_modules() if hasattr(m, "lora_A")}
  assert any("linear_attn.in_proj_qkv" in n for n in adapted) and any("self_attn.q_proj" in n for n in adapted)
  with torch.no_grad():
    want = back(**hf_kwargs(ours.cfg, c)).logits.numpy()
  valid = c["mask"].astype(bool)
  np.testing.assert_allclose(got[valid], want[valid], atol=ATOL, rtol=0)
  assert float(np.abs(got - base).max()) > 1e-3


def test_sharded_forward_equals_single_device(untied):
  """Loaded over a ('fsdp', 'tensor') mesh of the 8 test devices, jitted: the single-device logits."""
  from flax import nnx

  from jaxcap.sharding import make_mesh

  _, ours, directory = untied
  c = case(ours.cfg, "mixed_batch")
  positions, vision = our_inputs(ours.cfg, c)
  args = jnp.asarray(c["ids"]), jnp.asarray(positions), jnp.asarray(c["mask"], bool), vision
  want, _ = ours(*args)
  mesh = make_mesh({"tensor": 2, "fsdp": 4})
  sharded = load_hf_checkpoint(directory, mesh=mesh)
  graphdef, params = nnx.split(sharded)
  assert any(not x.sharding.is_fully_replicated for x in jax.tree.leaves(params))
  with jax.set_mesh(mesh):
    got = jax.jit(lambda p, *a: nnx.merge(graphdef, p)(*a)[0])(params, *args)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=0)


def test_flops_count_softmax_attention_in_the_full_layers_only():
  """The analytic FLOPs of a hybrid decoder: quadratic attention from its full-attention layers alone, plus the
  linear layers' per-token mixing; a plain decoder's count is unchanged by the hybrid terms."""
  from jaxcap.models.flops import full_attention_layers, linear_mixing_flops
  from jaxcap.models.qwen25vl_presets import tiny

  t = qwen35_tiny().text
  assert full_attention_layers(t) == 2 and full_attention_layers(tiny().text) == tiny().text.num_hidden_layers
  assert linear_mixing_flops(tiny().text) == 0
  per_head = 2 * 16 * 24 + 64 * (16 + 24)
  assert linear_mixing_flops(t) == 2.0 * 4 * 4 * per_head  # 4 linear layers x 4 value heads


@pytest.mark.parametrize("qtype", ["int8", "nf4"])
def test_qlora_quantizes_every_targeted_kernel_and_stays_near_the_base(untied, qtype):
  """QLoRA on the hybrid decoder: the targeted kernels of both kinds of layer quantized, zero adapters near the
  float32 logits (quantization error only), the adapters alone trainable."""
  from flax import nnx

  from jaxcap.models import lora

  _, ours, directory = untied
  c = case(ours.cfg, "single_image")
  positions, vision = our_inputs(ours.cfg, c)
  args = jnp.asarray(c["ids"]), jnp.asarray(positions), jnp.asarray(c["mask"], bool), vision
  base = np.asarray(ours(*args)[0])
  targets = lora.LORA_TARGETS + lora.LINEAR_ATTENTION_TARGETS
  model = lora.apply_lora(load_hf_checkpoint(directory), rank=4, alpha=8.0, targets=targets, weight_qtype=qtype)
  quantized = {
    jax.tree_util.keystr(p)
    for p, _ in jax.tree_util.tree_leaves_with_path(nnx.state(model))
    if "qvalue" in jax.tree_util.keystr(p)
  }
  assert any("linear_attn" in p and "in_proj_qkv" in p for p in quantized) and any("self_attn" in p for p in quantized)
  got = np.asarray(model(*args)[0])
  assert np.isfinite(got).all()
  # the quantization error, relative to the logits: int8's ~1%, nf4's 4-bit grid ~10% on these tiny random kernels
  assert np.linalg.norm(got - base) / np.linalg.norm(base) < {"int8": 0.05, "nf4": 0.3}[qtype]
