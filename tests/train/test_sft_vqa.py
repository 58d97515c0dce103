"""VQA examples in the SFT mix (`sft.vqa_fraction`): with 0 the SFT batches are exactly those of before; with a
fraction, that share of records are lettered multiple-choice prompts with the answer as target, drawn per
(seed, step, record) so a resumed run replays them; SFT learns the VQA targets."""

import functools

import jax
import numpy as np
import pytest
from flax import nnx
from vqa_student import tiny_world

import jaxcap.models as M
from jaxcap.data.records import ImageRecord, MultipleChoiceQuestion
from jaxcap.processing import word_tokenizer
from jaxcap.processing.vqa import letter_token_ids, vqa_prompt, vqa_target
from jaxcap.sharding import make_mesh
from jaxcap.processing.tokenizer import encode_targets
from jaxcap.train.rollouts.batching import Batcher
from jaxcap.config_files import validate
from jaxcap.train.rollouts.loader import record_loader
from jaxcap.config.training import Optim
from jaxcap.train.steps.state import init_train_state, make_optimizer
from jaxcap.train.steps.updates import sft_step
from jaxcap.train.learner.sft import SFTUpdate
from jaxcap.train.steps.batches import HostBatch
from jaxcap.train.learner.vqa import vqa_questions


def _targets(rec, rng):
  """A caption that consumes the step's generator, so a shifted draw would show."""
  return f"{rec.reference_caption} {int(rng.integers(1000))}"


def _update(fraction, micro=1):
  c, _, train, _, model, processor = tiny_world()
  c = c.copy_and_resolve_references()
  c.sft.vqa_fraction = fraction
  batcher = Batcher(processor, c, make_mesh({"fsdp": 1}, devices=jax.devices()[:1]), media_threads=1)
  update = SFTUpdate(batcher, _targets, processor.tokenizer, model.cfg.eos_token_id, micro, c.sft.max_target_tokens)
  return update, train, processor, model


def _capture(update, batch, rng, step=None):
  """What the update hands its step function: (prompts, targets, mask, layout) fetched to the host."""
  got = []

  def step_fn(state, prompts, ids, mask, layout):
    got.append(jax.device_get((prompts, ids, mask, layout)))
    return state, {}

  with jax.set_mesh(update.batcher.mesh):
    update(step_fn, None, batch, rng, step)
  return got[0]


def _same_tree(a, b):
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  assert jax.tree.structure(a) == jax.tree.structure(b) and len(la) == len(lb)
  for x, y in zip(la, lb):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_vqa_fraction_zero_gives_the_sft_batches_of_before():
  update, train, processor, model = _update(0.0, micro=2)
  records = train[:4]
  assert update.vqa_fraction == 0.0 and update.seed == 0  # from the run config
  b = update.batcher
  # the SFT update as it was: every prompt data.prompt, every target drawn from the step's generator
  with jax.set_mesh(b.mesh):
    prompts, layout = b.prompts(b.host_prompts(b.inputs(records), 2), 2)
  rng = np.random.default_rng([0, 0, 7])
  ids, mask = encode_targets(processor.tokenizer, [_targets(r, rng) for r in records], 24, model.cfg.eos_token_id)
  want = jax.device_get((prompts, b.micro(ids, 2), b.micro(mask, 2), layout))
  _same_tree(_capture(update, records, np.random.default_rng([0, 0, 7])), want)
  prepared = update.prepare(records, step=7)  # as the loader prepares it
  assert prepared.questions is None
  _same_tree(_capture(update, prepared, np.random.default_rng([0, 0, 7])), want)


def _records(n, with_questions=True):
  q = lambda i, k: MultipleChoiceQuestion(f"r{i}/q{k}", f"question {k}?", ("a", "b", "c"), "b")
  return [
    ImageRecord(id=f"r{i}", questions=tuple(q(i, k) for k in range(3)) if with_questions else ()) for i in range(n)
  ]


def test_vqa_examples_are_drawn_per_seed_step_and_record():
  records = _records(600) + _records(100, with_questions=False)
  draw = lambda **kw: vqa_questions(records, **({"fraction": 0.3, "seed": 0, "step": 5} | kw))
  got = draw()
  asked = [q for q in got[:600] if q is not None]
  assert 0.25 < len(asked) / 600 < 0.35, len(asked)
  assert all(q is None for q in got[600:])  # records without questions always get captions
  assert all(q.id.startswith(r.id + "/") for q, r in zip(got, records) if q is not None)
  assert {q.id[-2:] for q in asked} == {"q0", "q1", "q2"}  # any of the record's questions
  assert draw() == got  # a resumed run replays the step
  assert vqa_questions(records[::-1], fraction=0.3, seed=0, step=5) == got[::-1]  # per record, not per row
  assert draw(step=6) != got and draw(seed=1) != got
  assert draw(fraction=0.0) == [None] * len(records)


def test_a_vqa_share_outside_zero_to_one_is_named():
  c = tiny_world()[0].copy_and_resolve_references()
  c.sft.batch_size = 4
  for bad in (1.0, -0.1):
    c.sft.vqa_fraction = bad
    with pytest.raises(ValueError, match=rf"sft.vqa_fraction={bad}: must be in \[0, 1\)"):
      validate(c)
  c.sft.vqa_fraction = 0.5
  validate(c)


def test_sft_batches_mix_lettered_questions_with_their_answers_and_replay():
  update, train, processor, model = _update(0.5)
  tok, records = processor.tokenizer, train[:8]
  seen = 0
  for step in range(3):
    batch = update.prepare(records, step=step)
    assert batch.questions == vqa_questions(records, fraction=0.5, seed=0, step=step)
    prompts, ids, mask, _ = _capture(update, batch, np.random.default_rng(step))
    rng = np.random.default_rng(step)
    captions = [_targets(r, rng) for r in records]  # caption rows keep the targets of a run without VQA
    for row, q in enumerate(batch.questions):
      text = tok.decode(prompts.ids[0, row][prompts.mask[0, row]])
      target = tok.decode(ids[0, row][mask[0, row]][:-1])
      if q is None:
        assert text.endswith(update.batcher.config.data.prompt + "<|im_end|>\n<|im_start|>assistant\n")
        assert target and captions[row].startswith(target)  # cut at sft.max_target_tokens
      else:
        seen += 1
        assert vqa_prompt(q) in text and "\nA. " in text
        assert target == vqa_target(q) == f"{'ABCD'[q.answer_index]}. {q.answer}"
    replay = _capture(update, update.prepare(records, step=step), np.random.default_rng(step))
    _same_tree(replay[:3], (prompts, ids, mask))
  assert 0 < seen < 24
  # the loader hands prepare each batch's index, the step, and a resumed loader goes on from its position
  loader = record_loader(records, 4, seed=0, process_index=0, process_count=1, prepare=update.prepare)
  batches = [next(loader) for _ in range(4)]
  for step, b in enumerate(batches):
    assert isinstance(b, HostBatch) and b.questions == vqa_questions(b.records, fraction=0.5, seed=0, step=step)
  again = record_loader(records, 4, seed=0, process_index=0, process_count=1, prepare=update.prepare)
  next(again), next(again)
  resumed = record_loader(records, 4, seed=0, process_index=0, process_count=1, prepare=update.prepare)
  resumed.set_state(again.get_state())
  assert [next(resumed).questions for _ in range(2)] == [b.questions for b in batches[2:]]
  for it in (loader, again, resumed):
    it.close()
  with pytest.raises(ValueError, match="needs the step"):
    update.prepare(records)


def test_option_letters_must_be_single_tokens():
  cfg = M.tiny()
  tok = word_tokenizer("what colour is it ? A B".split(), cfg)
  assert len(letter_token_ids(tok, 2)) == 2
  with pytest.raises(ValueError, match="option letter 'C'"):
    letter_token_ids(tok, 3)  # 'C' is <unk> in this vocabulary


@pytest.mark.slow
def test_sft_loss_falls_on_vqa_targets():
  update, train, processor, model = _update(0.95)
  records = train[:4]
  graphdef, params = nnx.split(model)
  opt = make_optimizer(Optim(3e-3, grad_clip=0.0), 20)
  state = init_train_state(params, opt, jax.random.key(0))
  step_fn = jax.jit(functools.partial(sft_step, graphdef=graphdef, optimizer=opt))
  # one fixed draw (one compiled program): the loss on its targets, almost all VQA answers, falls
  batch = update.prepare(records, step=0)
  assert sum(q is not None for q in batch.questions) >= 3
  losses = []
  with jax.set_mesh(update.batcher.mesh):
    for step in range(20):
      state, metrics = update(step_fn, state, batch, np.random.default_rng(0))
      losses.append(float(metrics.result()["loss"]))
  assert losses[-1] < 0.5 * losses[0], losses
