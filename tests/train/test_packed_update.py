"""Packed micro-batches (jaxcap.train.packing.rows / packed / packed_step / packed_batch): log-probs, loss and gradients
equal the padded path's (f32) on mixed image sizes, a video and a text-only prompt, for every aggregation mode,
across micro-batch splits, and with rollout correction, mask_truncated and the KL term. The main job with packed
micro-batches end to end: tests/train/test_rollout_engine_config.py."""

import dataclasses

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxcap.models as M
from jaxcap.models import segment_attention
from jaxcap.models.rope_index import rope_index
from jaxcap.models.vision import vision_layout
from jaxcap.rl import PolicyLossConfig
from jaxcap.rl.rollout_correction import RolloutCorrectionConfig
from jaxcap.train.packing.inputs import PackedInputs, packed_sequence_logprobs
from jaxcap.train.packing.steps import packed_rl_step, packed_sft_step
from jaxcap.train.packing.rows import VisionItem, pack
from jaxcap.train.packing.assignment import assign, fill_rows
from jaxcap.train.steps.state import init_train_state
from jaxcap.train.steps.updates import PromptBatch, RolloutBatch, rl_step, sequence_logprobs, sft_step

CFG = M.tiny()
G, C = 2, 9
# per prompt: (text before, [(kind, grid)], text after); image grids of three sizes, a 2-frame video, text only
PROMPTS = [
  (3, [("image", (1, 4, 4))], 2),
  (2, [("image", (1, 2, 6)), ("image", (1, 2, 2))], 3),
  (5, [], 0),
  (1, [("video", (2, 2, 4))], 2),
]
LENGTHS = [9, 2, 1, 7, 5, 9, 3, 4]  # completion tokens per sequence, uneven


def _case():
  """Prompts left-padded in one micro-batch [1, Np, P], their rollouts [1, N, C], the step's pixels (images then
  videos, as a pack) and its vision items."""
  rng = np.random.default_rng(0)
  unit = CFG.vision.spatial_merge_size**2
  rows, images, videos = [], [], []
  for p, (before, media, after) in enumerate(PROMPTS):
    ids = list(rng.integers(0, 400, before))
    for kind, grid in media:
      token = CFG.image_token_id if kind == "image" else CFG.video_token_id
      ids += [CFG.vision_start_token_id] + [token] * (int(np.prod(grid)) // unit) + [CFG.vision_end_token_id]
      (images if kind == "image" else videos).append((p, kind == "video", grid))
    rows.append(ids + list(rng.integers(0, 400, after)))
  p_len = max(map(len, rows)) + 2
  ids = np.zeros((len(rows), p_len), np.int32)
  mask = np.zeros((len(rows), p_len), bool)
  for i, r in enumerate(rows):
    ids[i, p_len - len(r) :], mask[i, p_len - len(r) :] = r, True
  order = images + videos
  grids = lambda video: np.array([g for _, v, g in order if v == video]).reshape(-1, 3)
  positions, _ = rope_index(CFG, ids, mask, grids(False), grids(True), np.ones(len(videos), np.float32))
  items, start = [], 0
  for p, video, grid in order:
    items.append(VisionItem(p, video, grid, start))
    start += int(np.prod(grid))
  pixels = rng.normal(size=(start, CFG.vision.patch_dim)).astype(np.float32)
  layout = vision_layout(np.array([g for _, _, g in order]), CFG.vision)
  prompts = PromptBatch(ids[None], positions[None], mask[None], pixels[None])
  n = len(rows) * G
  cmask = np.arange(C)[None] < np.array(LENGTHS)[:, None]
  rollouts = RolloutBatch(
    tokens=rng.integers(0, 400, (1, n, C)).astype(np.int32),
    mask=cmask[None],
    old_logprobs=(-rng.uniform(0.5, 3.0, (1, n, C))).astype(np.float32),
    rewards=rng.normal(size=(1, len(rows), G, 1)).astype(np.float32),
    reward_valid=np.ones((1, len(rows), G, 1), bool),
    weights=np.ones((1,), np.float32),
  )
  return prompts, rollouts, pixels, layout, items


CASE = _case()


def _pack(budget, share=False):
  prompts, rollouts, pixels, _, items = CASE
  return PackedInputs(pixels, _rows(budget, share))


def _rows(budget, share=False):
  """The case packed under `budget`; `share`: each prompt once per row for the completions that follow it."""
  prompts, rollouts, _, _, items = CASE
  rows = pack(
    prompts.ids[0],
    prompts.mask[0],
    rollouts.mask[0],
    budget,
    image_token_id=CFG.image_token_id,
    video_token_id=CFG.video_token_id,
    items=items,
    vision_cfg=CFG.vision,
    share=share,
  )
  if share:  # fewer prompt copies than sequences: some row holds a prompt once for two completions
    prompt_slots = (rows.parents == rows.segments) & (rows.segments > 0)
    copies = sum(
      len(np.unique(row[mask]))
      for row, mask in zip(rows.segments.reshape(-1, rows.shape[2]), prompt_slots.reshape(-1, rows.shape[2]))
    )
    assert copies < rows.seq_valid.sum(), (copies, rows.seq_valid.sum())
  return rows


@pytest.fixture(params=[None, 4], ids=["block32", "block4"])
def block(request, monkeypatch):
  """The packer's attention block: the default (32 slots: dense attention over these tests' short rows) or 4 slots
  (rows of several blocks: the blocked attention over a key window where the budget allows, budget 64)."""
  if request.param:
    monkeypatch.setattr(segment_attention, "BLOCK", request.param)
  return request.param or segment_attention.BLOCK


@pytest.fixture(scope="module")
def policy():
  graphdef, params = nnx.split(M.Qwen25VL(CFG, rngs=nnx.Rngs(0)))
  return graphdef, params


def test_first_fit_decreasing_assignment():
  assert fill_rows([5, 4, 3], 8, 2) == [0, 1, 0]
  assert fill_rows([5, 5, 5], 8, 2) is None
  # prompt groups stay whole where they fit; the longest group first
  row_len, rows, micros = assign([4, 1], [4, 4, 1, 1], group=2, budget=24)
  assert (row_len, rows) == (8, 3)
  assert [sorted(micros[0])] == [[((0,), 0), ((1,), 1), ((2,), 2), ((3,), 2)]] and len(micros) == 1
  assert [sorted(micros_) for micros_ in assign([4, 1], [4, 4, 1, 1], group=2, budget=16)[2]] == [
    [((0,), 0), ((1,), 1)],
    [((2,), 0), ((3,), 0)],
  ]
  # sequences a little over half the longest's ladder size: rows of twice that hold two each, fewer slots in all
  row_len, rows, micros = assign([40] * 4, [90, 80, 90, 80, 90, 80, 90, 80], group=2, budget=1024, steps=2)
  assert row_len == 256 and max(r for _, r in micros[0]) == 3 and len(micros) == 1
  # sharing the prompt: a group's completions follow one copy of it, 4 + 4 + 4 and 1 + 1 + 1 in one row of 16
  assert assign([4, 1], [4, 4, 1, 1], group=2, budget=24, share=True) == (16, 1, [[((0, 1), 0), ((2, 3), 0)]])
  # a group longer than a row splits into units, each with its prompt (10 + 6 + 4 and 10 + 5)
  _, _, micros = assign([10, 3], [6, 5, 4, 1, 1, 1], group=3, budget=20, share=True)
  assert sorted(u for mb in micros for u, _ in mb) == [(0, 2), (1,), (3, 4, 5)]
  with pytest.raises(ValueError, match="micro_batch_tokens"):
    assign([40], [10], group=1, budget=32)


@pytest.mark.parametrize("share", [False, True], ids=["repeated", "shared"])
@pytest.mark.parametrize("budget", [64, 32])
def test_packed_logprobs_equal_padded(policy, budget, block, share):
  graphdef, params = policy
  prompts, rollouts, pixels, layout, _ = CASE
  want = jax.jit(functools.partial(sequence_logprobs, graphdef))(params, prompts, layout, rollouts.tokens)
  packed = _pack(budget, share)
  rows = packed.rows
  assert rows.padding_share() < 0.5 and (budget > 32 or rows.shape[0] > 1)
  if not share:
    assert (rows.window is not None) == (block == 4 and budget == 64)  # 2 sequences per row of 8 blocks, window 6
  got = jax.jit(functools.partial(packed_sequence_logprobs, graphdef))(params, prompts, packed, rollouts.tokens)
  m = rollouts.mask
  np.testing.assert_allclose(np.asarray(got)[m], np.asarray(want)[m], rtol=1e-5, atol=1e-6)
  assert np.all(np.asarray(got)[~m] == 0)


def _grads_optimizer():
  """An 'optimizer' whose state is the step's gradients and whose update is zero: the step's grads, exactly."""
  return optax.GradientTransformation(
    lambda p: jax.tree.map(jnp.zeros_like, p), lambda g, s, p=None: (jax.tree.map(jnp.zeros_like, g), g)
  )


@functools.lru_cache(maxsize=None)
def _padded_step(graphdef, aggregation):
  cfg = PolicyLossConfig(aggregation=aggregation, max_gen_len=16, kl_coef=0.0)
  return jax.jit(functools.partial(rl_step, graphdef=graphdef, optimizer=_grads_optimizer(), loss_config=cfg))


SLOW = pytest.mark.slow  # ~25 s each on a loaded 2-core machine (two programs compiled)


# token-mean at both blocks; the other aggregations at the default block only: they run at budget 24, whose rows are
# dense at either block
@pytest.mark.parametrize(
  "aggregation,block",
  [
    ("token-mean", None),
    ("token-mean", 4),
    pytest.param("seq-mean-token-sum", None, marks=SLOW),
    pytest.param("seq-mean-token-mean", None, marks=SLOW),
    pytest.param("seq-mean-token-sum-norm", None, marks=SLOW),
  ],
  ids=[
    "token-mean-block32",
    "token-mean-block4",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
  ],
  indirect=["block"],
)
def test_packed_update_equals_padded(policy, aggregation, block):
  graphdef, params = policy
  prompts, rollouts, pixels, layout, _ = CASE
  opt = _grads_optimizer()
  state = init_train_state(params, opt, jax.random.key(0))
  padded, want_m = _padded_step(graphdef, aggregation)(state, prompts, rollouts, layout)
  want = jax.tree.leaves(padded.opt_state)
  cfg = PolicyLossConfig(aggregation=aggregation, max_gen_len=16, kl_coef=0.0)
  step = jax.jit(functools.partial(packed_rl_step, graphdef=graphdef, optimizer=opt, loss_config=cfg))
  # several micro-batches of uneven token and sequence counts; token-mean also as one micro-batch (accumulate's
  # loop-free path)
  for budget, share in [(b, s) for b in ((24, 64) if aggregation == "token-mean" else (24,)) for s in (False, True)]:
    packed = _pack(budget, share)
    assert share or (packed.rows.window is not None) == (block == 4 and budget == 64)
    new, got_m = step(state, prompts, rollouts, packed)
    np.testing.assert_allclose(float(got_m["loss"]), float(want_m["loss"]), rtol=1e-5)
    got = jax.tree.leaves(new.opt_state)
    errors = [float(jnp.linalg.norm(g - w) / jnp.maximum(jnp.linalg.norm(w), 1e-30)) for g, w in zip(got, want)]
    assert max(errors) < 1e-5, (budget, packed.rows.shape, max(errors))


def test_packed_sft_step_equals_padded(policy, block):
  """SFT's packed step: one target per prompt (each prompt's first rollout as its target, uneven lengths); the
  token-mean NLL and every gradient leaf equal the padded step's, over several micro-batches and over one."""
  graphdef, params = policy
  prompts, rollouts, pixels, layout, items = CASE
  targets, target_mask = rollouts.tokens[:, ::G], rollouts.mask[:, ::G]  # [1, Np, C]
  opt = _grads_optimizer()
  state = init_train_state(params, opt, jax.random.key(0))
  padded, want_m = jax.jit(functools.partial(sft_step, graphdef=graphdef, optimizer=opt))(
    state, prompts, targets, target_mask, layout
  )
  want = jax.tree.leaves(padded.opt_state)
  step = jax.jit(functools.partial(packed_sft_step, graphdef=graphdef, optimizer=opt))
  for budget in (24, 64):
    rows = pack(
      prompts.ids[0], prompts.mask[0], target_mask[0], budget, image_token_id=CFG.image_token_id,
      video_token_id=CFG.video_token_id, items=items, vision_cfg=CFG.vision,
    )  # fmt: skip
    assert (rows.shape[0] > 1) == (budget == 24) and (rows.window is not None) == (block == 4 and budget == 64)
    new, got_m = step(state, prompts, targets, target_mask, PackedInputs(pixels, rows))
    np.testing.assert_allclose(float(got_m["loss"]), float(want_m["loss"]), rtol=1e-5)
    got = jax.tree.leaves(new.opt_state)
    errors = [float(jnp.linalg.norm(g - w) / jnp.maximum(jnp.linalg.norm(w), 1e-30)) for g, w in zip(got, want)]
    assert max(errors) < 1e-5, (budget, rows.shape, max(errors))


def _options_case():
  """CASE's rollouts with what the options read: behaviour log-probs off the old ones by up to +-0.7 nats per token
  (some tokens and sequences outside the correction's bands), two truncated sequences (one of each of two prompts),
  and reference log-probs."""
  prompts, rollouts, pixels, layout, _ = CASE
  rng = np.random.default_rng(7)
  shape = rollouts.old_logprobs.shape
  behaviour = rollouts.old_logprobs + rng.uniform(-0.7, 0.7, shape).astype(np.float32)
  truncated = np.zeros(shape[:2], bool)
  truncated[0, [0, 5]] = True
  ref = rollouts.old_logprobs + rng.normal(0, 0.3, shape).astype(np.float32)
  return dataclasses.replace(rollouts, behaviour_logprobs=behaviour, truncated=truncated, ref_logprobs=ref)


OPTIONS = {
  "correction": dict(correction=RolloutCorrectionConfig(is_level="token", reject="seq_mean_k1", reject_upper=1.3)),
  "sequence_tis": dict(
    correction=RolloutCorrectionConfig(is_level="sequence", is_threshold=1.5, reject="token_k3", reject_upper=0.05)
  ),
  "mask_truncated": dict(mask_truncated=True),
  "kl": dict(kl_coef=0.1),
}


@pytest.mark.parametrize(
  "options",
  [
    ("correction", "mask_truncated", "kl"),  # all at once: one pair of programs
    pytest.param(("sequence_tis",), marks=SLOW),
  ],
)
def test_packed_update_with_options_equals_padded(policy, options):
  """Rollout correction (TIS / MIS over the whole batch), mask_truncated and the KL term: the packed step's loss,
  gradients and metrics equal the padded step's, over several uneven micro-batches."""
  graphdef, params = policy
  prompts, _, pixels, layout, _ = CASE
  rollouts = _options_case()
  kw = {k: v for name in options for k, v in OPTIONS[name].items()}
  cfg = PolicyLossConfig(aggregation="token-mean", max_gen_len=16, kl_coef=kw.pop("kl_coef", 0.0))
  opt = _grads_optimizer()
  state = init_train_state(params, opt, jax.random.key(0))
  common = dict(graphdef=graphdef, optimizer=opt, loss_config=cfg, **kw)
  padded, want_m = jax.jit(functools.partial(rl_step, **common))(state, prompts, rollouts, layout)
  new, got_m = jax.jit(functools.partial(packed_rl_step, **common))(state, prompts, rollouts, _pack(24, True))
  assert _pack(24, True).rows.shape[0] > 1
  # the options bite: some tokens rejected and weights truncated, some truncated sequences masked
  bites = {"correction": ("reject_seq_frac", "is_truncated_frac"), "sequence_tis": ("reject_token_frac",)}
  for name in options:
    for k in bites.get(name, ()):
      assert 0 < float(want_m[f"rollout_corr/{k}"]) < 1, (name, k, float(want_m[f"rollout_corr/{k}"]))
  if "mask_truncated" in options:
    assert float(want_m["truncated/masked_frac"]) > 0
  assert set(got_m) == set(want_m)
  # num_tokens is a micro-batch's count, averaged over micro-batches by their weights like every metric: it depends
  # on the split in the padded path too
  for k in set(want_m) - {"num_tokens"}:
    np.testing.assert_allclose(np.asarray(got_m[k]), np.asarray(want_m[k]), rtol=1e-5, atol=1e-7, err_msg=k)
  got, want = jax.tree.leaves(new.opt_state), jax.tree.leaves(padded.opt_state)
  errors = [float(jnp.linalg.norm(g - w) / jnp.maximum(jnp.linalg.norm(w), 1e-30)) for g, w in zip(got, want)]
  assert max(errors) < 1e-5, (options, max(errors))
