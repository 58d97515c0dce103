"""LoRA students through the rollout paths, both families: the static `Sampler` and the paged engine decode the same
greedy tokens with nonzero adapters (on the decoder and, with `vision`, the ViT / merger), the adapters change
them, and the samplers' log-probs are the update's teacher-forced log-probs of the adapted model."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxcap.models as M
from jaxcap.models import lora
from jaxcap.models.families import FAMILIES, layout_for
from jaxcap.models.qwen3vl_presets import qwen3vl_tiny
from jaxcap.processing.model_inputs import ModelInputs
from jaxcap.sampling import Sampler, SamplingConfig
from jaxcap.sampling.engine import EngineConfig, PagedSampler
from jaxcap.train.steps.logprobs import completion_logprobs

NEW, G = 6, 2
CONFIGS = {"qwen2_5_vl": M.tiny, "qwen3_vl": qwen3vl_tiny}


def _inputs(cfg, family: str) -> ModelInputs:
  """Two left-padded prompts: one with a 4 x 4-patch image (4 merged tokens), one text-only and shorter."""
  v = cfg.vision
  grid = np.array([[1, 4, 4]])
  merged = int(grid.prod()) // v.spatial_merge_size**2
  image = [cfg.vision_start_token_id] + [cfg.image_token_id] * merged + [cfg.vision_end_token_id]
  rows = [[5, 9, *image, 17, 23, 8], [3, 40, 11]]
  width = max(map(len, rows))
  ids = np.zeros((2, width), np.int32)
  mask = np.zeros((2, width), bool)
  for i, r in enumerate(rows):
    ids[i, width - len(r) :], mask[i, width - len(r) :] = r, True
  positions, deltas = FAMILIES[family].rope_index(cfg, ids, mask, grid, None)
  out = ModelInputs(ids, mask, positions, deltas)
  out.pixel_values = np.asarray(jax.random.normal(jax.random.key(2), (int(grid.prod()), v.patch_dim)), np.float32)
  out.grid_thw = out.image_grid_thw = grid
  out.layout = layout_for(grid, v)
  return out


def _with_b(params, scale=0.3):
  def one(path, x):
    if "_lora_b" not in ".".join(str(getattr(k, "key", k)) for k in path):
      return x
    return scale * jax.random.normal(jax.random.key(abs(hash(str(path))) % 2**31), x.shape, x.dtype)

  return jax.tree_util.tree_map_with_path(one, params)


@pytest.mark.parametrize("family", ["qwen2_5_vl", pytest.param("qwen3_vl", marks=pytest.mark.slow)])
def test_lora_rollouts_paged_equal_static_and_teacher_forced(family):
  cfg = CONFIGS[family]()
  base = FAMILIES[family].model_cls(cfg, rngs=nnx.Rngs(0))
  batch = _inputs(cfg, family)
  greedy = SamplingConfig(temperature=0, max_new_tokens=NEW, stop_ids=())

  graphdef, params = nnx.split(lora.apply_lora(nnx.clone(base), rank=4, alpha=8.0, vision=True, seed=1))
  model = nnx.merge(graphdef, _with_b(params))
  static = Sampler(model, sampling=greedy)(batch, jax.random.key(0), num_samples=G)
  engine = EngineConfig(slots=3, page_size=4, segment_steps=3, pages=32)  # refills mid-rollout
  paged = PagedSampler(model, sampling=greedy, engine=engine)(batch, jax.random.key(0), num_samples=G)
  tokens = np.asarray(static.tokens)
  np.testing.assert_array_equal(np.asarray(paged.tokens), tokens)

  # the decode loops' log-probs are the adapted model's teacher-forced ones (what the update computes), not the base's
  forced = lambda m: completion_logprobs(  # each prompt embedded once for its G completions
    m,
    jnp.asarray(batch.input_ids),
    jnp.asarray(batch.positions),
    jnp.asarray(batch.attention_mask),
    batch.vision(),
    jnp.asarray(tokens),
  )[0]
  want = forced(model)
  for got in (static.policy_logprobs, paged.policy_logprobs):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5, rtol=0)
  assert float(jnp.abs(forced(base) - want).max()) > 1e-2  # the adapters act


def test_a_sampler_over_a_checkpointed_lora_student_keeps_its_adapters():
  """A student trained with activation checkpointing (`remat`) samples through the same graph without it: its LoRA
  adapters (and the unrolled tower on CPU) are kept, so the greedy tokens are those of the student without remat."""
  import dataclasses

  cfg = M.tiny()
  batch = _inputs(cfg, "qwen2_5_vl")
  greedy = SamplingConfig(temperature=0, max_new_tokens=NEW, stop_ids=())
  tokens = {}
  for remat in ("none", "full"):
    base = M.Qwen25VL(dataclasses.replace(cfg, remat=remat), rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(lora.apply_lora(base, rank=4, alpha=8.0, vision=True, seed=1))
    sampler = Sampler(nnx.merge(graphdef, _with_b(params)), sampling=greedy)
    assert sampler.cfg.remat == "none"
    tokens[remat] = np.asarray(sampler(batch, jax.random.key(0)).tokens)
  plain = Sampler(M.Qwen25VL(cfg, rngs=nnx.Rngs(0)), sampling=greedy)
  np.testing.assert_array_equal(tokens["full"], tokens["none"])
  assert (np.asarray(plain(batch, jax.random.key(0)).tokens) != tokens["none"]).any()  # the adapters act
