"""The released CapRL / CapRL++ answerer: a raw completion prompt (Qwen chat markup, "The answer is" pre-filled,
per-media templates) sent to /v1/completions, sampled, a reply with no letter scored wrong; CapRL++'s labels
(options A.. then the cannot-answer option always F) and CapRL's unshuffled options."""

import dataclasses

import numpy as np
from fastapi import FastAPI, Request
from judge_servers import serve_in_thread

from jaxcap.data.records import ImageRecord, MultipleChoiceQuestion
from jaxcap.judges.factory import build_judge
from jaxcap.judges.fleet import JudgeFleet, RoleConfig
from jaxcap.judges.http_judge import HttpJudge
from jaxcap.judges.parsing import first_letter
from jaxcap.judges.protocol import MultipleChoiceRequest
from jaxcap.judges.answerer import Answerer
from jaxcap.judges.settings import JudgeConfig
from jaxcap.rewards.caprl import CapRLConfig, CapRLReward
from jaxcap.world.judge_server import rule_based_app_for_manifest
from jaxcap.world.dataset import generate_dataset, judge_for_manifest
from jaxcap.rewards.mix import build_reward

RELEASED = Answerer(
  template="caprl_released", video_template="caprl_released_video", temperature=0.6, max_tokens=10, no_letter="wrong"
)
QUESTION = MultipleChoiceQuestion("q0", "What color is the car?", ("red", "blue", "green", "black"), "green")


def _record(id_, video=False):
  return ImageRecord(id=id_, image=f"{id_}.mp4" if video else f"{id_}.png", questions=(QUESTION,))


def completion_app(replies):
  """/v1/completions answering from `replies` in turn; records every body; no chat route."""
  app = FastAPI()
  app.state.bodies = []

  @app.post("/v1/completions")
  async def complete(request: Request):
    body = await request.json()
    app.state.bodies.append(body)
    text = replies[(len(app.state.bodies) - 1) % len(replies)]
    return {"choices": [{"index": 0, "text": text}], "usage": {"prompt_tokens": 5, "completion_tokens": 2}}

  return app


def test_released_answerer_asks_raw_completions_with_the_media_template_and_sampling():
  app = completion_app([" C.", " F", " the car", " D"])
  reward = CapRLReward(None, CapRLConfig.caprl_plus(questions_per_caption=2, seed=1))
  with serve_in_thread(app) as endpoint:
    config = JudgeConfig(kind="http", endpoints=endpoint.url, model="answerer", api_key_env="", answerer=RELEASED)
    judge = build_judge(config)
    reward.judge = judge
    try:
      batch = reward(["A green car.", "[00:01] a green car drives off."], [_record("img"), _record("clip", True)])
    finally:
      judge.fleet.close()
  bodies = app.state.bodies
  assert len(bodies) == 4 and all("messages" not in b for b in bodies)
  assert {b["temperature"] for b in bodies} == {0.6} and {b["max_tokens"] for b in bodies} == {10}
  image, video = (
    [b["prompt"] for b in bodies if "A green car." in b["prompt"]],
    [b["prompt"] for b in bodies if "drives off" in b["prompt"]],
  )
  assert len(image) == len(video) == 2
  assert all(p.endswith("  <|im_end|>\n<|im_start|>assistant\nThe answer is") for p in image)
  assert all(p.endswith("  <|im_end|>\n        <|im_start|>assistant\n        The answer is") for p in video)
  assert all("Pay close attention to timestamps" in p for p in video)
  for p in image + video:  # four shuffled options A-D, then the cannot-answer option, always F
    lines = p.split("Question: What color is the car?\n")[1].split("  <|im_end|>")[0].split("\n")
    assert [line[:6] for line in lines] == ["   - A", "   - B", "   - C", "   - D", "   - F"]
    assert lines[-1] == "   - F) Can not answer based on the caption"
  # every reply is an answer: a letter, or none (' the car' -> wrong, not masked)
  assert batch.valid.all() and not batch.failed_judgments
  asked = batch.evidence[0]["caprl/accuracy"]["questions"] + batch.evidence[1]["caprl/accuracy"]["questions"]
  assert sorted(q["letter"] or "-" for q in asked) == sorted(["C", "F", "-", "D"])
  golds = [q["gold"] for q in asked]
  expected = [float(q["letter"] == q["gold"]) for q in asked]
  assert all(g in "ABCD" for g in golds)
  np.testing.assert_allclose(batch.values[:, 0], [np.mean(expected[:2]), np.mean(expected[2:])])


def test_a_sampled_answerer_is_asked_every_time_a_greedy_one_is_cached():
  for temperature, requests in ((0.6, 3), (0.0, 1)):
    app = completion_app([" B"])
    with serve_in_thread(app) as endpoint:
      role = RoleConfig((endpoint,), temperature=temperature, max_tokens=10, structured_output="none")
      with JudgeFleet({"judge": role}) as fleet:
        judge = HttpJudge(fleet, answerer=dataclasses.replace(RELEASED, temperature=temperature))
        same = MultipleChoiceRequest("x", "c", "q?", ("a", "b"))
        for _ in range(3):  # one after another: a greedy reply is cached once it came
          assert [r.reply for r in judge.answer_multiple_choice([same])] == ["B"]
    assert len(app.state.bodies) == requests, temperature


def test_first_letter_reads_as_the_released_parse_easy():
  assert [first_letter(r) for r in (" C.", "B) blue", " I think A", "none", "", " f")] == ["C", "B", "I", "", "", ""]


def test_presets_caprl_keeps_the_datas_order_and_caprl_plus_labels_cannot_answer_f():
  record = _record("r")
  rng = np.random.default_rng(0)
  plain = CapRLReward(None, CapRLConfig.caprl())
  for question, options, gold in plain.draw(record, rng):
    assert options == QUESTION.options and gold == 2 and plain.labels(options) == ("A", "B", "C", "D")
  assert plain.config.reward_scale == 2.0 and plain.config.questions_per_caption == 8 and plain.config.with_replacement
  plus = CapRLReward(None, CapRLConfig.caprl_plus())
  orders = set()
  for question, options, gold in plus.draw(record, np.random.default_rng(1)):
    assert options[-1] == "Can not answer based on the caption" and options[gold] == "green"
    assert plus.labels(options) == ("A", "B", "C", "D", "F")
    orders.add(options[:4])
  assert len(orders) > 1 and plus.config.reward_scale == 1.0  # shuffled per draw; accuracy as is


def test_labels_travel_through_the_rule_based_server_and_completion_route(tmp_path):
  """The jaxcap judge server answers /v1/completions too, in the request's labels: equal to the in-process judge."""
  manifest = str(generate_dataset(tmp_path, 3, seed=2))
  records, direct = judge_for_manifest(manifest)
  captions = [r.reference_caption for r in records]
  config = {"caprl": {"preset": "caprl_plus", "questions_per_caption": 3}}
  with serve_in_thread(rule_based_app_for_manifest(manifest)) as endpoint:
    with JudgeFleet({"judge": RoleConfig((endpoint,), structured_output="none")}) as fleet:
      via_http = build_reward(config, HttpJudge(fleet, answerer=dataclasses.replace(RELEASED, temperature=0.0)))(
        captions, records
      )
  expected = build_reward(config, direct)(captions, records)
  np.testing.assert_array_equal(via_http.valid, expected.valid)
  np.testing.assert_allclose(via_http.values, expected.values)
  assert via_http.values.max() > 0  # the reference captions answer some questions: labels were read right
