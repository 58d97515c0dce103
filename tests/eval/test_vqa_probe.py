"""The VQA probe (`jaxcap.eval.vqa`): a policy's answers to the manifest's questions with the image, the option whose
whole answer ("B. red" + end of turn) is most likely; and the evaluator's `vqa_probe` block, which probes HF checkpoints and
writes their accuracies and paired differences into the report."""

import json

import jax
import numpy as np
import pytest
from eval_world import world
from flax import nnx
from test_eval_cli_captions import _config
from vqa_student import tiny_world

import jaxcap.eval.vqa as vqa_lib
from jaxcap.checkpoint import save_hf_checkpoint
from jaxcap.data.records import ImageRecord
from jaxcap.eval.cli import run
from jaxcap.eval.metrics import RatioMetric
from jaxcap.eval.report import EvalReport
from jaxcap.eval.vqa import vqa_answers, vqa_scores
from jaxcap.models.qwen25vl import Qwen25VL
from jaxcap.processing.vqa import option_answer, vqa_prompt
from jaxcap.sharding import make_mesh, param_shardings
from jaxcap.train.rollouts import loader as data_lib


@pytest.mark.slow
def test_probe_of_a_random_student_counts_every_question_and_matches_one_forward_per_question():
  _, _, _, records, model, processor = tiny_world()
  records = records[:4]
  answers = vqa_answers(model, processor, records, batch_size=3, image_size=84)  # 20 questions: a short last batch
  metric = vqa_scores(model, processor, records, batch_size=3, image_size=84)
  assert isinstance(metric, RatioMetric)
  assert metric.den == tuple(float(len(r.questions)) for r in records) and sum(metric.den) == len(answers.choice)
  assert metric.num == tuple(
    float(((answers.choice == answers.answer) & (answers.image == i)).sum()) for i in range(len(records))
  )
  # the batched, left-padded, bucketed scoring equals the model's plain forward over prompt + answer, alone
  eos = model.cfg.eos_token_id
  k = 0
  for record in records[:2]:
    for q in record.questions:
      inputs = processor([data_lib.conversation(record, vqa_prompt(q), 84)])
      want = []
      for option in range(len(q.options)):
        answer = processor.tokenizer(option_answer(q, option), add_special_tokens=False)["input_ids"] + [eos]
        ids = np.concatenate([inputs.input_ids, np.asarray([answer])], axis=1)
        start = inputs.positions.max() + 1
        positions = np.concatenate(
          [inputs.positions, np.broadcast_to(start + np.arange(len(answer)), (3, 1, len(answer)))], axis=2
        )
        mask = np.ones(ids.shape, bool)
        logits, _ = model(ids, positions, mask, inputs.vision())
        logp = jax.nn.log_softmax(np.asarray(logits[0], np.float64), axis=-1)
        p = inputs.input_ids.shape[1]
        want.append(float(sum(logp[p - 1 + j, t] for j, t in enumerate(answer))))
      np.testing.assert_allclose(answers.logits[k, : len(q.options)], want, rtol=1e-4, atol=1e-3)
      assert answers.choice[k] == int(np.argmax(want)) and answers.answer[k] == q.answer_index
      k += 1


def test_probe_on_a_mesh_gives_the_same_answers():
  """Params sharded as in training, prompts batch-sharded."""
  _, _, _, records, model, processor = tiny_world()
  records = records[:2]
  answers = vqa_answers(model, processor, records, batch_size=8)
  mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  graphdef, params = nnx.split(model)
  sharded = vqa_answers(
    (graphdef, jax.device_put(params, param_shardings(params, mesh))), processor, records, batch_size=8, mesh=mesh
  )
  finite = np.isfinite(answers.logits)
  np.testing.assert_allclose(sharded.logits[finite], answers.logits[finite], rtol=1e-4, atol=1e-4)
  assert (sharded.choice == answers.choice).all()


def test_forced_letters_give_the_exact_accuracy(monkeypatch):
  _, _, _, records, model, processor = tiny_world()
  records = records[:5] + [ImageRecord(id="no_questions", image=records[5].image)]
  questions = [q for r in records for q in r.questions]

  def forced(scores):
    def fn(params, prompts, ids, mask):  # option k of every question scores scores[k]
      k = ids.shape[0] // prompts.input_ids.shape[0]
      return np.tile(np.asarray(scores, np.float32)[:k], prompts.input_ids.shape[0])

    return lambda graphdef: fn

  monkeypatch.setattr(vqa_lib, "_option_scores_fn", forced([0.0, 5.0, 1.0, 1.0]))  # 'B' always wins
  m = vqa_scores(nnx.split(model), processor, records, batch_size=4, image_size=84)
  assert m.den == tuple(float(len(r.questions)) for r in records) and m.den[-1] == 0.0  # no questions: den 0
  assert m.num == tuple(float(sum(q.answer_index == 1 for q in r.questions)) for r in records)
  assert m.value == pytest.approx(sum(q.answer_index == 1 for q in questions) / len(questions))
  # the highest letter is 'D', but a question with 2 or 3 options can only be answered with its own letters
  monkeypatch.setattr(vqa_lib, "_option_scores_fn", forced([0.0, 1.0, 2.0, 3.0]))
  answers = vqa_answers(model, processor, records, batch_size=4, image_size=84)
  assert answers.choice.tolist() == [len(q.options) - 1 for q in questions]
  assert any(len(q.options) < 4 for q in questions)


def test_eval_cli_probes_checkpoints_into_the_report(tmp_path):
  c, workdir, _, _, model, _ = tiny_world()
  first = save_hf_checkpoint(model, tmp_path / "sft", tokenizer_dir=workdir / "tokenizer")
  other = Qwen25VL(model.cfg, rngs=nnx.Rngs(1))
  second = save_hf_checkpoint(other, tmp_path / "rl", tokenizer_dir=workdir / "tokenizer")
  probe = dict(checkpoints=f"sft={first},rl={second}", batch_size=16, image_size=0, system="none")
  config = _config(tmp_path, captioners=("reference=builtin:reference",), vqa_probe=probe)
  paths = run(config)
  records = world()[1]
  doc = json.loads(paths["json"].read_text())["vqa_probe"]
  assert list(doc["models"]) == ["sft", "rl"] and doc["compared_to"] == "sft" and list(doc["differences"]) == ["rl"]
  assert doc["questions"] == sum(len(r.questions) for r in records)
  assert doc["models"]["sft"]["den"] == [float(len(r.questions)) for r in records]
  # the checkpoint as the CLI loads it answers as the in-memory student
  want = vqa_scores(model, tiny_world()[5], records, batch_size=16)
  assert doc["models"]["sft"]["num"] == list(want.num)
  accuracy = 100 * sum(want.num) / sum(want.den)
  assert doc["models"]["sft"]["estimate"]["mean"] == pytest.approx(accuracy)
  rl = doc["models"]["rl"]["estimate"]["mean"]
  assert doc["differences"]["rl"]["mean"] == pytest.approx(rl - accuracy)
  assert EvalReport.load(paths["json"]).vqa_probe == doc  # round-trips
  md = paths["markdown"].read_text()
  assert "## VQA probe" in md and "| checkpoint | accuracy | minus sft |" in md
  assert f"| sft | {accuracy:.1f} [" in md and "| rl | " in md


def test_probe_checkpoints_are_checked_before_any_work(tmp_path):
  config = _config(tmp_path, vqa_probe=dict(checkpoints=f"sft={tmp_path / 'missing'}"))
  with pytest.raises(ValueError, match="no config.json there"):
    run(config)
  with pytest.raises(ValueError, match="write NAME=PATH"):
    run(_config(tmp_path, vqa_probe=dict(checkpoints="just_a_path")))
  assert not (tmp_path / "report").exists()
