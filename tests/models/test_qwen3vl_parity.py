"""Parity of the Flax Qwen3-VL with `transformers`' Qwen3VLForConditionalGeneration (f32, CPU) on tiny random
models built offline, saved with `save_pretrained` and read back through `load_hf_checkpoint`.

Inputs are built directly (token ids, patches, grids): Qwen3-VL's processor is not in jaxcap yet."""

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
from jaxcap.models.qwen3vl import Qwen3VL
from jaxcap.models.qwen3vl_config import Qwen3VLConfig
from jaxcap.models.qwen3vl_presets import qwen3vl_tiny
from jaxcap.models.qwen3vl_vision import qwen3_layout_shape, qwen3_vision_layout
from jaxcap.models.rope_index import qwen3vl_rope_index
from tests.models.vl_cases import case, greedy, hf_kwargs, our_inputs

ATOL = 1e-4
# (tied head, DeepStack block indexes): two DeepStack layers in block order; then three, out of order, one of them
# the last block (the list position picks the merger, block order the decoder layer)
VARIANTS = {"untied": (False, (0, 1)), "tied": (True, (2, 0, 1))}


def _hf_model(cfg: Qwen3VLConfig, seed: int):
  torch.manual_seed(seed)
  hc = transformers.Qwen3VLConfig(**cfg.to_hf_dict())
  hc._attn_implementation = "eager"
  model = transformers.Qwen3VLForConditionalGeneration(hc).float().eval()
  with torch.no_grad():  # HF inits norms to 1 and biases to 0; perturb them so every param matters
    for name, p in model.named_parameters():
      if "norm" in name and name.endswith("weight"):
        p.add_(0.1 * torch.randn_like(p))
      elif name.endswith("bias"):
        p.add_(0.02 * torch.randn_like(p))
  return model


def _load(name: str, tmp_path_factory):
  tied, deepstack = VARIANTS[name]
  cfg = qwen3vl_tiny()
  cfg = cfg.replace(
    text=cfg.text.__class__(**{**cfg.text.__dict__, "tie_word_embeddings": tied}),
    vision=cfg.vision.__class__(**{**cfg.vision.__dict__, "deepstack_visual_indexes": deepstack}),
  )
  directory = tmp_path_factory.mktemp(f"qwen3vl_{name}")
  ref = _hf_model(cfg, seed=len(name))
  ref.save_pretrained(directory)
  return ref, load_hf_checkpoint(directory), directory


@pytest.fixture(scope="module")
def untied(tmp_path_factory):
  """(transformers model, jaxcap model, checkpoint directory) of the untied variant: what does not depend on the
  head or the DeepStack layout (positions, sharding, FLOPs, padding, compiled variants) runs on it alone."""
  return _load("untied", tmp_path_factory)


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
  return _load("tied", tmp_path_factory)


@pytest.fixture(params=list(VARIANTS))
def models(request):
  """Each variant in turn, for what the head or the DeepStack layout changes."""
  return request.getfixturevalue(request.param)


# ------------------------------------------------------------------------------------------------- inputs
_case, _hf_kwargs, _ours = case, hf_kwargs, our_inputs


KINDS = ["single_image", "two_images", "text_only", "video", "mixed_batch"]
# generation cases: each kind on one variant, so both heads are covered at half the compiles
PAIRS = [("two_images", "untied"), ("video", "tied")]


# ------------------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("side", ["left", "right"])
def test_position_ids_equal_get_rope_index(untied, kind, side):
  ref, ours, _ = untied
  c = _case(ours.cfg, kind, side)
  kw = _hf_kwargs(ours.cfg, c)
  want, deltas = ref.model.get_rope_index(
    kw["input_ids"], kw["mm_token_type_ids"], kw.get("image_grid_thw"), kw.get("video_grid_thw"), kw["attention_mask"]
  )
  got, got_deltas = qwen3vl_rope_index(ours.cfg, c["ids"], c["mask"], c["image_grid"], c["video_grid"])
  np.testing.assert_array_equal(got, want.numpy())
  np.testing.assert_array_equal(got_deltas, deltas.numpy()[:, 0])


def test_vision_features_and_deepstack_match(models):
  """Merged features and every DeepStack feature, for images of three sizes and a two-frame video in one pack."""
  ref, ours, _ = models
  grid = np.array([[1, 4, 6], [1, 8, 4], [1, 2, 2], [2, 4, 4]])
  px = np.random.RandomState(0).randn(int(np.prod(grid, -1).sum()), ours.cfg.vision.patch_dim).astype(np.float32)
  with torch.no_grad():
    want = ref.model.visual(torch.as_tensor(px), grid_thw=torch.as_tensor(grid))
  feats, deepstack = ours.visual(jnp.asarray(px), qwen3_vision_layout(grid, ours.cfg.vision))
  np.testing.assert_allclose(np.asarray(feats), want.pooler_output.numpy(), atol=ATOL, rtol=0)
  assert deepstack.shape[0] == len(want.deepstack_features) == len(ours.cfg.vision.deepstack_visual_indexes) > 1
  for got, expected in zip(deepstack, want.deepstack_features):
    np.testing.assert_allclose(np.asarray(got), expected.numpy(), atol=ATOL, rtol=0)
  # padded to a larger layout shape (a bucket): the same real features, first and in order
  exact = qwen3_layout_shape(grid)
  shape = exact.union(exact.__class__(exact.patches + 16, 1, 1, exact.frames + 2, exact.frame_len + 4))
  padded, padded_ds = ours.visual(
    jnp.asarray(np.pad(px, ((0, 16), (0, 0)))), qwen3_vision_layout(grid, ours.cfg.vision, shape)
  )
  n = len(feats)
  np.testing.assert_allclose(np.asarray(padded)[:n], np.asarray(feats), atol=1e-5, rtol=0)
  np.testing.assert_allclose(np.asarray(padded_ds)[:, :n], np.asarray(deepstack), atol=1e-5, rtol=0)


@pytest.mark.parametrize(
  "kind,side,variant",
  [(k, "left", "untied") for k in KINDS]
  + [("mixed_batch", "right", v) for v in VARIANTS]
  + [("two_images", "left", "tied")],
)
def test_logits_match(request, kind, side, variant):
  """Every kind on the untied variant; on the tied one (its head and DeepStack order), the cases with vision."""
  ref, ours, _ = request.getfixturevalue(variant)
  c = _case(ours.cfg, kind, side)
  with torch.no_grad():  # transformers derives its own positions from mm_token_type_ids and the grids
    want = ref(**_hf_kwargs(ours.cfg, c)).logits.numpy()
  positions, vision = _ours(ours.cfg, c)
  got, _ = ours(jnp.asarray(c["ids"]), jnp.asarray(positions), jnp.asarray(c["mask"], bool), vision)
  valid = c["mask"].astype(bool)
  np.testing.assert_allclose(np.asarray(got)[valid], want[valid], atol=ATOL, rtol=0)


def test_deepstack_changes_the_logits(models):
  """DeepStack is live: zeroing the DeepStack mergers' output changes the image tokens' successors' logits."""
  _, ours, _ = models
  c = _case(ours.cfg, "single_image")
  positions, vision = _ours(ours.cfg, c)
  x, deepstack = ours.embed_vision(jnp.asarray(c["ids"]), vision)
  mask = jnp.asarray(c["mask"], bool)
  with_ds, _ = ours.decode(x, jnp.asarray(positions), mask, deepstack=deepstack)
  without, _ = ours.decode(x, jnp.asarray(positions), mask)
  assert float(jnp.abs(with_ds - without).max()) > 1e-3


def test_family_and_text_only_embed_contract(untied):
  _, ours, directory = untied
  assert family_of_checkpoint(directory).model_cls is Qwen3VL and isinstance(ours, Qwen3VL)
  c = _case(ours.cfg, "single_image")
  _, vision = _ours(ours.cfg, c)
  with pytest.raises(ValueError, match="embed_vision"):
    ours.embed(jnp.asarray(c["ids"]), vision)


def test_hf_round_trip_is_bit_exact(models, tmp_path):
  """Exported through save_hf_checkpoint: the same tensor names and bits as transformers saved, a config.json that
  reads back as the same config, and transformers loads it whole (no missing or unexpected keys) to equal weights."""
  ref, ours, directory = models
  save_hf_checkpoint(ours, tmp_path)
  original, exported = load_file(directory / "model.safetensors"), load_file(tmp_path / "model.safetensors")
  assert sorted(original) == sorted(exported)
  for k, v in exported.items():
    assert original[k].dtype == v.dtype and np.array_equal(original[k], v), k
  assert Qwen3VLConfig.from_hf_dict(json.loads((tmp_path / "config.json").read_text())) == Qwen3VLConfig.from_hf_dict(
    json.loads((directory / "config.json").read_text())
  )
  back, info = transformers.Qwen3VLForConditionalGeneration.from_pretrained(tmp_path, output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"]
  theirs = back.state_dict()
  assert all(torch.equal(v, theirs[k]) for k, v in ref.state_dict().items())


@pytest.mark.parametrize("kind,variant", PAIRS)
def test_greedy_generation_equals_transformers_generate(request, kind, variant):
  """Token-equal to `generate` (greedy), and every step's logits equal its logits: a tiny random model tends to
  repeat one token, so the logits are what shows the cache and the decode positions right."""
  ref, ours, _ = request.getfixturevalue(variant)
  steps = 8
  c = _case(ours.cfg, kind)
  with torch.no_grad():
    out = ref.generate(
      **_hf_kwargs(ours.cfg, c), max_new_tokens=steps, do_sample=False, output_logits=True, return_dict_in_generate=True
    )
  want = out.sequences[:, c["ids"].shape[1] :].numpy()
  tokens, logits = greedy(ours, c, steps)
  assert want.shape == tokens.shape  # no early end of sequence in these cases: every step compared
  np.testing.assert_array_equal(tokens, want)
  np.testing.assert_allclose(logits, torch.stack(out.logits, 1).numpy(), atol=ATOL, rtol=0)


@pytest.mark.parametrize("preset", ["qwen3-vl-2b", "qwen3-vl-4b", "qwen3-vl-8b", "tiny", "mid"])
def test_presets_round_trip_through_transformers_config(preset):
  """A preset's config.json, read by transformers and written back, is the same preset; its shapes are consistent
  (mRoPE sections fill half a head, DeepStack blocks exist and feed no more layers than the decoder has)."""
  from jaxcap.models.qwen3vl_presets import PRESETS

  cfg = PRESETS[preset]()
  assert Qwen3VLConfig.from_hf_dict(transformers.Qwen3VLConfig(**cfg.to_hf_dict()).to_dict()) == cfg
  assert sum(cfg.text.mrope_section) == cfg.text.head_dim // 2
  ds = cfg.vision.deepstack_visual_indexes
  assert max(ds) < cfg.vision.depth and len(ds) <= cfg.text.num_hidden_layers
  assert cfg.vision.out_hidden_size == cfg.text.hidden_size


def test_non_qwen3_config_json_is_a_clear_error():
  with pytest.raises(ValueError, match="qwen3_vl"):
    Qwen3VLConfig.from_hf_dict({"model_type": "qwen2_5_vl"})


def test_sharded_forward_equals_single_device(untied):
  """Loaded over a ('fsdp', 'tensor') mesh of the 8 test devices, jitted: the single-device logits."""
  from flax import nnx

  from jaxcap.sharding import make_mesh

  _, ours, directory = untied
  c = _case(ours.cfg, "mixed_batch")
  positions, vision = _ours(ours.cfg, c)
  args = jnp.asarray(c["ids"]), jnp.asarray(positions), jnp.asarray(c["mask"], bool), vision
  want, _ = ours(*args)
  mesh = make_mesh({"tensor": 2, "fsdp": 4})
  sharded = load_hf_checkpoint(directory, mesh=mesh)
  graphdef, params = nnx.split(sharded)
  assert any(not x.sharding.is_fully_replicated for x in jax.tree.leaves(params))
  with jax.set_mesh(mesh):
    got = jax.jit(lambda p, *a: nnx.merge(graphdef, p)(*a)[0])(params, *args)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=0)


def test_flops_count_every_block_as_full_attention_and_deepstack_as_mergers(untied):
  from flax import nnx

  from jaxcap.models.flops import model_flops, param_counts

  _, ours, _ = untied
  v = ours.cfg.vision
  counts = param_counts(nnx.state(ours, nnx.Param))
  merger_params = sum(int(np.prod(a.shape)) for a in jax.tree.leaves(nnx.state(ours.visual.merger, nnx.Param)))
  deepstack_params = sum(
    int(np.prod(a.shape)) for a in jax.tree.leaves(nnx.state(ours.visual.deepstack_merger_list, nnx.Param))
  )
  assert counts["merger"] == merger_params + deepstack_params
  t = ours.cfg.text
  assert counts["embedding"] == t.vocab_size * t.hidden_size + v.num_position_embeddings * v.hidden_size
  f = model_flops(ours.cfg, counts, sequences=2, prompt=10, completion=5, images=2, patches_per_image=24)
  patches = 48
  want = (
    6 * counts["vision"] * patches + 6 * counts["merger"] * patches / 4 + 12 * v.hidden_size * v.depth * 24 * patches
  )
  assert f["vision"] == pytest.approx(want, rel=1e-12)


def test_padded_vision_pack_gives_the_same_logits(untied):
  """The mixed batch's images and video padded to a larger layout shape (a bucket): the same logits."""
  _, ours, _ = untied
  c = _case(ours.cfg, "mixed_batch")
  exact = qwen3_layout_shape(np.concatenate([c["image_grid"], c["video_grid"]]))
  shape = exact.__class__(exact.patches + 32, 1, 1, exact.frames + 3, exact.frame_len + 8)
  args = jnp.asarray(c["ids"]), None, jnp.asarray(c["mask"], bool)
  positions, vision = _ours(ours.cfg, c)
  _, padded = _ours(ours.cfg, c, shape)
  want, _ = ours(args[0], jnp.asarray(positions), args[2], vision)
  got, _ = ours(args[0], jnp.asarray(positions), args[2], padded)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=0)


@pytest.mark.slow  # three more loads and a gradient: ~30 s on 2 cores
def test_remat_unrolled_and_bf16_variants(untied):
  """Rematerialised and unrolled stacks compute the same logits, gradients reach the DeepStack mergers, and
  float32 masters with bfloat16 compute stay near the float32 logits."""
  from flax import nnx

  _, ours, directory = untied
  c = _case(ours.cfg, "two_images")
  positions, vision = _ours(ours.cfg, c)
  args = jnp.asarray(c["ids"]), jnp.asarray(positions), jnp.asarray(c["mask"], bool), vision
  want = np.asarray(ours(*args)[0])
  for overrides in (dict(remat="full"), dict(scan_layers=False)):
    model = load_hf_checkpoint(directory, **overrides)
    np.testing.assert_allclose(np.asarray(model(*args)[0]), want, atol=1e-5, rtol=0)
  graphdef, params = nnx.split(load_hf_checkpoint(directory, remat="dots"))
  grads = jax.grad(lambda p: jnp.sum(nnx.merge(graphdef, p)(*args)[0][..., :8] ** 2))(params)
  ds_grads = jax.tree.leaves(grads["visual"]["deepstack_merger_list"])
  assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))
  assert all(float(jnp.abs(g).max()) > 0 for g in ds_grads)
  mixed = load_hf_checkpoint(directory, dtype=jnp.bfloat16, param_dtype=jnp.float32)
  got = mixed(*args)[0]
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(got), want, atol=0.05 * np.abs(want).max(), rtol=0)


# ------------------------------------------------------------------- the samplers and the update's log-probs
def _model_inputs(cfg: Qwen3VLConfig, c: dict):
  """A case as the left-padded `ModelInputs` batch a processor would give (images then videos in one pack)."""
  from jaxcap.models.families import layout_for
  from jaxcap.processing.model_inputs import ModelInputs

  positions, deltas = qwen3vl_rope_index(cfg, c["ids"], c["mask"], c["image_grid"], c["video_grid"])
  grids = [g for g in (c["image_grid"], c["video_grid"]) if g is not None]
  px = [p for p in (c["image_px"], c["video_px"]) if p is not None]
  out = ModelInputs(c["ids"].astype(np.int32), c["mask"].astype(bool), positions, deltas)
  out.image_grid_thw, out.video_grid_thw = c["image_grid"], c["video_grid"]
  if grids:
    out.pixel_values, out.grid_thw = np.concatenate(px), np.concatenate(grids)
    out.layout = layout_for(out.grid_thw, cfg.vision)  # the family registry picks Qwen3-VL's layout
  return out


@pytest.mark.parametrize("kind,variant", PAIRS)
def test_samplers_and_update_logprobs_equal_transformers(request, kind, variant):
  """Qwen3-VL through jaxcap's own rollout paths: the static-cache `Sampler` and the paged engine (prompts and the
  vision pack padded to their buckets, DeepStack at prefill) give `generate`'s greedy tokens, and the update's
  `completion_logprobs` of those tokens (each prompt embedded once for its G = 2 completions) equal the log-softmax
  of transformers' logits on prompt + completion."""
  from jaxcap.sampling import Sampler, SamplingConfig
  from jaxcap.sampling.engine import EngineConfig, PagedSampler
  from jaxcap.train.steps.logprobs import completion_logprobs

  ref, ours, _ = request.getfixturevalue(variant)
  steps = 6
  c = _case(ours.cfg, kind)
  with torch.no_grad():
    want = ref.generate(**_hf_kwargs(ours.cfg, c), max_new_tokens=steps, do_sample=False)
  want = want[:, c["ids"].shape[1] :].numpy()
  assert want.shape[1] == steps  # no early end of sequence: every step compared
  batch = _model_inputs(ours.cfg, c)
  greedy = SamplingConfig(temperature=0, max_new_tokens=steps)
  static = Sampler(ours, sampling=greedy)(batch, jax.random.key(0), num_samples=2)
  np.testing.assert_array_equal(np.asarray(static.tokens), np.repeat(want, 2, axis=0))
  engine = EngineConfig(slots=4, page_size=4, segment_steps=3, pages=64)
  paged = PagedSampler(ours, sampling=greedy, engine=engine)(batch, jax.random.key(0), num_samples=2)
  np.testing.assert_array_equal(np.asarray(paged.tokens), np.repeat(want, 2, axis=0))

  completions = np.repeat(want, 2, axis=0).astype(np.int32)
  got, _ = completion_logprobs(
    ours,
    jnp.asarray(batch.input_ids),
    jnp.asarray(batch.positions),
    jnp.asarray(batch.attention_mask),
    batch.vision(),
    jnp.asarray(completions),
  )
  full = dict(_hf_kwargs(ours.cfg, c))
  full["input_ids"] = torch.as_tensor(np.concatenate([c["ids"], want], 1))
  full["attention_mask"] = torch.as_tensor(np.concatenate([c["mask"], np.ones_like(want)], 1))
  types = torch.zeros_like(full["input_ids"], dtype=torch.int)
  types[:, : c["ids"].shape[1]] = full["mm_token_type_ids"]
  full["mm_token_type_ids"] = types
  with torch.no_grad():
    logits = ref(**full).logits[:, c["ids"].shape[1] - 1 : -1].double()
  hf = torch.log_softmax(logits, -1).gather(-1, torch.as_tensor(want)[..., None])[..., 0].numpy()
  np.testing.assert_allclose(np.asarray(got), np.repeat(hf, 2, axis=0), atol=ATOL, rtol=0)
