import numpy as np

from jaxcap.world.captions import reference_caption
from jaxcap.world.curation import CurationConfig, curate_questions
from jaxcap.world.questions import generate_questions, parse_question
from jaxcap.world.scene import Scene, SceneObject, WorldConfig, sample_scene
from jaxcap.judges.protocol import MultipleChoiceRequest
from jaxcap.world.judge import RuleBasedJudge
from jaxcap.data.records import MultipleChoiceQuestion


def _gold_from_scene(q, scene):
  """Independent ground-truth oracle for the templates (not the judge)."""
  s = parse_question(q.question).slots
  objs = scene.objects
  find = scene.find
  return {
    "count_total": lambda: str(len(objs)),
    "count_colour": lambda: str(sum(o.colour == s["colour"] for o in objs)),
    "count_shape": lambda: str(sum(o.shape == s["shape"] for o in objs)),
    "colour": lambda: next(o.colour for o in objs if o.shape == s["shape"] and o.position == s["position"]),
    "shape": lambda: next(o.shape for o in objs if o.colour == s["colour"]),
    "size": lambda: find(s["name"]).size,
    "position": lambda: find(s["name"]).position,
    "relation": lambda: scene.decisive_relation(s["name"], s["other"]),
    "text": lambda: find(s["name"]).label,
    "existence": lambda: "yes" if find(s["name"]) else "no",
    "temporal_order": lambda: min(objs, key=lambda o: o.appear_frame).name,
    "motion": lambda: "it stays still" if find(s["name"]).motion == "still" else find(s["name"]).motion,
  }[q.kind]()


def test_every_question_parses_has_a_true_answer_and_false_distractors():
  judge = RuleBasedJudge()
  for seed in range(40):
    rng = np.random.default_rng(seed)
    scene = sample_scene(rng, f"s{seed}", WorldConfig(), clip=seed % 2 == 0)
    for q in generate_questions(scene, rng):
      assert parse_question(q.question) is not None, q.question
      assert q.answer == _gold_from_scene(q, scene), q
      assert len(set(q.options)) == len(q.options) >= 2
      for distractor in set(q.options) - {q.answer}:
        # Distractors never answer the question: the reference never leads the judge to them.
        reply = judge.answer_multiple_choice(
          [MultipleChoiceRequest(scene.id, reference_caption(scene), q.question, q.options)]
        )[0].reply
        assert q.options["ABCDEFGHI".index(reply)] != distractor


def test_kept_questions_pass_the_leakage_filter_and_dropped_ones_fail_it():
  judge = RuleBasedJudge()
  kinds = set()
  for seed in range(30):
    rng = np.random.default_rng(seed)
    scene = sample_scene(rng, f"s{seed}", WorldConfig(), clip=seed % 3 == 0)
    for v in curate_questions(judge, scene.id, generate_questions(scene, rng), reference_caption(scene)):
      assert v.kept == (v.accuracy_with > 0.75 and v.accuracy_without < 0.25)
      if v.kept:
        kinds.add(v.question.kind)
        assert v.accuracy_with == 1.0 and v.accuracy_without == 0.0
  assert kinds >= {"count_total", "colour", "position", "relation", "existence", "motion", "temporal_order"}


SCENE = Scene(
  "hand",
  (SceneObject("red", "circle", "large", (0.17, 0.17)), SceneObject("blue", "square", "small", (0.83, 0.2))),
  "grey",
)


def test_curation_keeps_and_drops_the_right_questions():
  good = MultipleChoiceQuestion(
    "good", "Where is the red circle?", ("top left", "center", "bottom", "right"), "top left"
  )
  unanswerable = MultipleChoiceQuestion(
    "hidden", "What size is the blue square?", ("small", "medium", "large"), "small"
  )
  leaky = MultipleChoiceQuestion(
    "leak", "Is the circle red or green, red being its colour?", ("red", "green", "blue", "black"), "red"
  )
  description = "There is a red circle in the top left. There is a blue square."  # omits the square's size
  verdicts = curate_questions(RuleBasedJudge(), "hand", [good, unanswerable, leaky], description)
  assert [v.kept for v in verdicts] == [True, False, False]
  assert verdicts[1].accuracy_with == verdicts[1].accuracy_without  # the description adds nothing: a guess
  assert verdicts[2].accuracy_without == 1.0  # the question text alone gives it away


def test_curation_drops_questions_whose_judgments_all_failed():
  good = MultipleChoiceQuestion("good", "Where is the red circle?", ("top left", "center"), "top left")
  (verdict,) = curate_questions(RuleBasedJudge(failure_rate=1.0), "hand", [good], "A red circle in the top left.")
  assert not verdict.kept and np.isnan(verdict.accuracy_with)


def test_clip_temporal_and_motion_questions_need_the_temporal_facts():
  clip = Scene(
    "clip",
    (
      SceneObject("red", "circle", "large", (0.17, 0.17), appear_frame=2, motion="right", velocity=(0.05, 0.0)),
      SceneObject("blue", "square", "small", (0.83, 0.8), appear_frame=0),
    ),
    "grey",
    num_frames=6,
  )
  questions = {q.kind: q for q in generate_questions(clip, np.random.default_rng(0))}
  assert questions["temporal_order"].answer == "blue square"
  assert {q.answer for q in generate_questions(clip, np.random.default_rng(0)) if q.kind == "motion"} == {
    "right",
    "it stays still",
  }
  static_description = "There is a large red circle in the top left. There is a small blue square in the bottom right."
  cfg = CurationConfig()
  with_time = curate_questions(RuleBasedJudge(), "clip", [questions["temporal_order"]], reference_caption(clip), cfg)
  without_time = curate_questions(RuleBasedJudge(), "clip", [questions["temporal_order"]], static_description, cfg)
  assert with_time[0].accuracy_with == 1.0
  # Without frame numbers the caption says nothing about order: the judge falls back to its blind guess.
  assert without_time[0].accuracy_with == without_time[0].accuracy_without
