"""Packed or padded, per step (`rl.packing_min_saving`, jaxcap.train.packing.rows.packing_pays): a step whose packing
saves less than the minimum share of its padded pass's decoder FLOPs runs the padded programs (a packed slot costs
more than its FLOPs: gathers, attention in blocks), unless a padded slice would not fit the token budget; the run's
`ByLayout` programs dispatch on the layout the step hands them, and both layouts give the same log-probs."""

import dataclasses
import types

import jax
import numpy as np
import pytest
from flax import nnx

import jaxcap.models as M
from jaxcap.models.flops import decoder_pass_flops, param_counts
from jaxcap.models.segment_attention import SegmentWindow
from jaxcap.processing import Processor, word_tokenizer
from jaxcap.sampling import Sampler, SamplingConfig
from jaxcap.sharding import make_mesh
from jaxcap.train.steps.batches import HostBatch
from jaxcap.train.rollouts.batching import Batcher
from jaxcap.config_files import base_config
from image_records import random_image_records
from jaxcap.train.packing.inputs import PackedInputs
from jaxcap.train.packing.rows import PackedRows, packing_pays
from jaxcap.train.steps.programs import ByLayout, RunPrograms
from jaxcap.train.learner.sft import SFTUpdate
from jaxcap.train.learner.rl import RLLearner

CFG = M.tiny()
PROMPT = "describe the image in detail ."
G, C = 2, 24


def _rows(slots_shape, targets, window=None) -> PackedRows:
  z = np.zeros(slots_shape, np.int32)
  m = slots_shape[0]
  t = np.zeros((m, targets), np.int32)
  return PackedRows(z, z, z, t, t, z[:, :1, 0], z[:, :1, 0] > 0, window=window)


# a decoder layer of 304 weights (q, k, v, o: 4 x 1 x 1; MLP 3 x 1 x 100): 608 FLOPs a slot; head 2 x 100 a
# position; attention 4 a (query, key) pair
TEXT = types.SimpleNamespace(
  hidden_size=1, num_attention_heads=1, head_dim=1, num_key_value_heads=1, intermediate_size=100,
  num_hidden_layers=1, vocab_size=100,
)  # fmt: skip


def test_decoder_pass_flops_hand_counted_and_against_the_params():
  assert decoder_pass_flops(TEXT, slots=3, head_positions=2, attention_pairs=7) == 3 * 608 + 2 * 200 + 7 * 4
  # a real config: 2 FLOPs per decoder weight a slot (norms and biases left out: within 2%)
  _, params = nnx.split(M.Qwen25VL(CFG, rngs=nnx.Rngs(0)))
  want = 2 * param_counts(params)["decoder"]
  assert decoder_pass_flops(CFG.text, slots=1, head_positions=0, attention_pairs=0) == pytest.approx(want, rel=0.02)


def test_packing_pays_on_hand_counted_flops():
  padded = (16, 10, 40)  # 16 sequences, prompts 10 wide, completions 40: 800 slots, 640 head positions, 16 x 50^2 pairs
  padded_flops = 800 * 608 + 640 * 200 + 40000 * 4  # 774,400
  window = SegmentWindow(block=4, blocks=13)  # 52 keys a query
  rows = _rows((1, 8, 92), 640, window)  # 736 slots, 640 targets, 736 x 52 pairs: 728,576, 5.9% saved
  pays, saving = packing_pays(rows, padded, 1, 800, 0.1, TEXT)
  assert saving == pytest.approx(1 - (736 * 608 + 640 * 200 + 736 * 52 * 4) / padded_flops) and not pays
  assert packing_pays(rows, padded, 1, 800, 0.05, TEXT)[0]
  # half the completion slots are targets: the LM head runs at 320 positions, 14.2% saved
  pays, saving = packing_pays(_rows((1, 8, 92), 320, window), padded, 1, 800, 0.1, TEXT)
  assert pays and saving == pytest.approx(1 - 664576 / padded_flops)
  # dense rows: every slot attends the whole row (92 keys), more than the padded pass computes
  assert packing_pays(_rows((1, 8, 92), 640), padded, 1, 800, 0.0, TEXT) == (False, pytest.approx(1 - 846336 / 774400))
  assert packing_pays(_rows((1, 8, 92), 640), padded, 1, 800, -1.0, TEXT)[0]  # < 0: always packed
  # a padded slice must fit the token budget: 800 slots in one slice exceed 736, in two slices of 400 they do not
  assert packing_pays(rows, padded, 1, 736, 0.1, TEXT)[0]
  assert not packing_pays(rows, padded, 2, 736, 0.1, TEXT)[0]
  assert packing_pays(rows, (15, 10, 40), 2, 399, 0.1, TEXT)[0]  # 8 of 15 sequences in the larger slice: 400 > 399
  # against a prompt-shared padded pass (8 prompts of G 2): 8 x 10 + 16 x 40 = 720 slots, 640 head positions,
  # 8 x 10^2 + 16 x 40 x 50 = 32,800 pairs: the packed rows (each prompt repeated) cost more, so padded runs
  shared_flops = 720 * 608 + 640 * 200 + 32800 * 4  # 696,960
  pays, saving = packing_pays(rows, padded, 1, 800, 0.0, TEXT, shared_prompts=8)
  assert not pays and saving == pytest.approx(1 - 728576 / shared_flops) and saving < 0


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
  records = random_image_records(tmp_path_factory.mktemp("images"), 4)
  config = base_config()
  config.data.prompt, config.data.image_size = PROMPT, 56
  config.rl.update(dict(micro_batch_tokens=1024, micro_batches=1, num_samples=G))
  processor = Processor(word_tokenizer(PROMPT.split(), CFG), CFG)
  return records, config, processor, M.Qwen25VL(CFG, rngs=nnx.Rngs(0))


def test_a_step_runs_packed_only_where_packing_pays_and_both_layouts_agree(parts):
  """Uniform completions as wide as the rollout arrays (prompts of one size: nothing to pack away) run padded;
  long-tailed ones packed. The run's log-prob program is a `ByLayout` pair and gives the same values either way."""
  records, config, processor, model = parts
  graphdef, params = nnx.split(model)
  mesh = make_mesh({"fsdp": 1}, devices=jax.devices()[:1])
  batcher = Batcher(processor, config, mesh, media_threads=1)
  sampler = Sampler(model, processor=processor, sampling=SamplingConfig(max_new_tokens=C))
  update = RLLearner(batcher, None, G, 1, True, micro_batch_tokens=1024)
  logprobs = RunPrograms(config, graphdef).logprobs()
  assert isinstance(logprobs, ByLayout)
  host = sampler.bucket(batcher.inputs(records))
  n = len(records) * G
  tokens = jax.numpy.asarray(np.random.RandomState(0).randint(0, CFG.text.vocab_size, (1, n, C)).astype(np.int32))
  real_prompt = int(np.asarray(host.prompts.attention_mask)[: host.rows].sum())
  with jax.set_mesh(mesh):
    placed = sampler.place(host)
    uniform, long_tailed = np.full(n, C), np.array([C, 1, 2, 1, 3, 1, 1, 2])
    got = {}
    for name, lengths in (("uniform", uniform), ("long-tailed", long_tailed)):
      prompts, layout, metrics = update.inputs(HostBatch(records, host), placed, lengths, tokens)
      packed = isinstance(layout, PackedInputs)
      assert packed == (name == "long-tailed") and metrics["packing/packed"] == float(packed), (name, metrics)
      if not packed:  # the padded layout's own share: prompt padding only, each prompt run once (share_prompt)
        slots = host.rows * host.prompts.input_ids.shape[1] + n * C
        share = 1 - (real_prompt + lengths.sum()) / slots
        assert metrics["packing/padding_share"] == pytest.approx(share) and metrics["packing/micro_batches"] == 1
      got[name] = np.asarray(logprobs(params, prompts, layout, tokens))
      # the other layout of the same step: forced packed (min saving < 0) or padded (no packing)
      other = dataclasses.replace(update, packing_min_saving=-1.0) if not packed else update
      if packed:
        prompts_o, layout_o = batcher.prompt_batch(placed, 1)
      else:
        prompts_o, layout_o, m = other.inputs(HostBatch(records, host), placed, lengths, tokens)
        assert isinstance(layout_o, PackedInputs) and m["packing/packed"] == 1.0
      want = np.asarray(logprobs(params, prompts_o, layout_o, tokens))
      mask = np.arange(C)[None] < lengths[:, None]
      np.testing.assert_allclose(got[name][0][mask], want[0][mask], rtol=1e-5, atol=1e-6, err_msg=name)
  batcher.close()


def test_sft_steps_choose_the_same_way(parts):
  """SFT's update decides per step as RL's: full-length targets of one-size prompts run padded, short ones packed;
  and under a budget a padded slice would exceed, packed whatever the saving."""
  records, config, processor, model = parts
  batcher = Batcher(processor, config, make_mesh({"fsdp": 1}, devices=jax.devices()[:1]), media_threads=1)
  t = 24
  update = SFTUpdate(batcher, None, processor.tokenizer, CFG.eos_token_id, 1, t, micro_batch_tokens=1024)
  host = HostBatch(records, batcher.host_prompts(batcher.inputs(records), 1))
  width = host.prompts.prompts.input_ids.shape[1] + t
  for lengths, budget, want in (([t] * 4, 1024, False), ([t, 2, 3, 1], 1024, True), ([t] * 4, 4 * width - 1, True)):
    _, layout, metrics = dataclasses.replace(update, micro_batch_tokens=budget).inputs(host, np.array(lengths), t)
    assert isinstance(layout, PackedInputs) == want and metrics["packing/packed"] == float(want), (lengths, budget)
  batcher.close()
