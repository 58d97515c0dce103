"""CapRL++'s rule rewards as the released code computes them (`serve_rm.py` compute_format_reward, `reward_fn.py`
_piecewise_length_reward): hand-computed values, and with CAPRL_REPO pointing at a checkout of InternLM/CapRL the
released functions themselves on the same captions; a plain Python reward function; judge.kind='none'."""

import ast
import logging
import os
import random
import re
from pathlib import Path

import numpy as np
import pytest

from jaxcap.config.schema import parse
from jaxcap.data.records import ImageRecord
from jaxcap.judges.factory import build_judge
from jaxcap.judges.no_judge import NoJudgeError
from jaxcap.judges.protocol import MultipleChoiceRequest
from jaxcap.rewards import build_reward, length_window, timestamp_format_score
from processes import load_config

RELEASED = Path("CapRL++/train/verl/recipe/video_captionrl")

# (caption, hand-computed score): validity v/m, coverage min(1, v/3), chrono; 0.45 cov*val + 0.25 val + 0.30 chr*val
TIMESTAMPS = [
  ("[00:00 - 00:05] A man runs. [00:06] He stops and [00:08] drops a wallet.", 1.0),
  ("[00:01] a door opens, [00:02] it closes.", 0.45 * 2 / 3 + 0.25 + 0.30),  # two valid of 3 for full coverage
  ("[00:10] a [00:05] b [00:20] c", 0.45 + 0.25),  # out of order: chrono 0
  ("[00:75] seconds past 59, then [01:10] a valid one", 0.5 * (0.45 / 3 + 0.25 + 0.30)),  # 1 valid of 2
  ("[01:00 - 00:30] ends before it starts, [02:00] b", 0.5 * (0.45 / 3 + 0.25 + 0.30)),
  ("[599:59] the last valid minute", 0.45 / 3 + 0.25 + 0.30),
  ("[600:00] one minute too many", 0.0),
  ("[0:5] too few digits, [a:bc] not a time", 0.0),
  ("no timestamps at all", 0.0),
  ("", 0.0),
]
LENGTHS = [(0, 1.0), (2047, 1.0), (2048, 1.0), (2500, 1.0 - 452 / 1024), (3072, 0.0), (4000, 0.0)]


def _released(file: str, names: set[str]) -> dict:
  """The top-level functions / constants `names` of the released file, or skip when no checkout is given."""
  root = os.environ.get("CAPRL_REPO")
  path = Path(root or "") / RELEASED / file
  if not root or not path.is_file():
    pytest.skip(f"set CAPRL_REPO to a checkout of InternLM/CapRL (looked for {path})")
  tree = ast.parse(path.read_text())
  keep = [
    n
    for n in tree.body
    if (isinstance(n, ast.FunctionDef) and n.name in names)
    or (isinstance(n, ast.Assign) and any(getattr(t, "id", None) in names for t in n.targets))
  ]
  scope = {"re": re, "random": random, "logger": logging.getLogger("released"), "tuple": tuple}
  exec(compile(ast.Module(keep, []), str(path), "exec"), scope)  # only the pure functions, none of the imports
  return scope


@pytest.mark.parametrize("caption,expected", TIMESTAMPS)
def test_timestamp_format_hand_values(caption, expected):
  assert timestamp_format_score(caption) == pytest.approx(expected, abs=1e-12)


def test_timestamp_format_equals_the_released_function():
  released = _released("serve_rm.py", {"_TIMESTAMP_BRACKET", "_parse_ts_groups", "compute_format_reward"})
  for caption, _ in TIMESTAMPS:
    for min_brackets, max_minute in ((3, 599), (1, 59), (5, 9)):
      want = released["compute_format_reward"](caption, min_brackets=min_brackets, max_minute=max_minute)
      assert timestamp_format_score(caption, min_brackets=min_brackets, max_minute=max_minute) == want, caption


def test_caption_length_hand_values_and_the_released_function():
  tokens, expected = zip(*LENGTHS)
  np.testing.assert_allclose(length_window(tokens), expected, rtol=0, atol=1e-7)
  np.testing.assert_array_equal(length_window([10, 11, 12], 11, 11), [1, 1, 0])  # a step when L1 = L2
  released = _released("reward_fn.py", {"_piecewise_length_reward"})["_piecewise_length_reward"]
  for l1, l2 in ((2048, 3072), (100, 100), (0, 10)):
    for n in (*tokens, l1 - 1, l1 + 1, l2 + 1):
      assert length_window([n], l1, l2)[0] == pytest.approx(released(n, l1, l2), abs=1e-7), (n, l1, l2)


def _records(n):
  return [ImageRecord(id=f"r{i}", image=f"r{i}.png") for i in range(n)]


def test_rule_rewards_mix_with_the_released_weights_counting_the_students_tokens():
  """qa + 0.2 format + 0.2 length, as the released server sums them; tokens from the tokenize passed in."""
  mix = build_reward(
    {"timestamp_format": {"weight": 0.2}, "caption_length": {"weight": 0.2, "full_until": 4, "zero_at": 8}},
    judge=None,
    tokenize=lambda s: s.split(),
  )
  captions = ["[00:01] a [00:02] b [00:03] c d e", "w " * 6, "[00:09] x [00:01] y"]  # 8, 6 and 4 words
  batch = mix(captions, _records(3))
  assert batch.names == ("timestamp_format/score", "caption_length/score")
  np.testing.assert_allclose(batch.weights, [0.2, 0.2])
  np.testing.assert_allclose(batch.values[:, 0], [1.0, 0.0, (0.45 * 2 / 3 + 0.25)], atol=1e-6)
  np.testing.assert_allclose(batch.values[:, 1], [0.0, 0.5, 1.0], atol=1e-6)  # linear from 4 words to 8
  assert batch.valid.all()
  assert batch.evidence[1]["caption_length/score"] == {"tokens": 6}
  with pytest.raises(ValueError, match="tokenize"):
    build_reward({"caption_length": {}}, judge=None)


def test_a_python_function_is_a_reward_and_none_masks(tmp_path):
  (tmp_path / "my_reward.py").write_text(
    "def score(captions, records, step, bonus=0.0):\n"
    "  return [None if 'skip' in c else len(c.split()) / 10 + bonus + step for c in captions]\n"
  )
  spec = f"{tmp_path / 'my_reward.py'}:score"
  mix = build_reward({"fn": {"function": spec, "options": {"bonus": 0.5}}}, judge=None)
  batch = mix(["one two", "skip me", "a b c d"], _records(3), step=2)
  assert batch.names == ("fn/score",)
  np.testing.assert_allclose(batch.values[:, 0], [2.7, 0.0, 2.9], atol=1e-6)
  np.testing.assert_array_equal(batch.valid[:, 0], [True, False, True])
  assert batch.failed_judgments == {"fn": 1}  # masked and counted, not scored 0
  (tmp_path / "short.py").write_text("def score(captions, records):\n  return [1.0]\n")
  with pytest.raises(ValueError, match="returned 1 values for 2 captions"):
    build_reward({"fn": {"function": f"{tmp_path / 'short.py'}:score"}}, judge=None)(["a", "b"], _records(2))
  with pytest.raises(ValueError, match="has no function 'nope'"):
    build_reward({"fn": {"function": f"{tmp_path / 'short.py'}:nope"}}, judge=None)
  with pytest.raises(ValueError, match="cannot import"):
    build_reward({"fn": {"function": "no_such_module_anywhere:score"}}, judge=None)


def test_judge_none_takes_only_rewards_that_need_no_judge():
  rewards = {"fn": {"function": "m:f"}, "timestamp_format": {"weight": 0.2}}
  ok = parse(load_config("caprl", **{"judge.kind": "none", "reward": rewards}))
  assert ok.judge.kind == "none"
  from jaxcap.config.schema import validate

  with pytest.raises(ValueError, match="judge.kind='none' but reward.caprl needs a judge"):
    validate(load_config("caprl", **{"judge.kind": "none"}))
  judge = build_judge(ok.judge)
  assert judge.answer_multiple_choice([]) == []
  with pytest.raises(NoJudgeError, match="answer_multiple_choice"):
    judge.answer_multiple_choice([MultipleChoiceRequest("r0", "a caption", "q?", ("a", "b"))])
