"""Shared synthetic dataset and scripted judges for the eval tests (not a test module)."""

from __future__ import annotations

import functools
import pathlib
import tempfile
from typing import Callable, Sequence

from jaxcap.world.dataset import generate_dataset, judge_for_manifest
from jaxcap.eval.captioners import CaptionSet, builtin_captions
from jaxcap.judges.protocol import MultipleChoiceReply, MultipleChoiceRequest, PairwiseRequest, PairwiseVerdict

WEAK_TEACHERS = ("terse", "hallucinating", "spatially_confused", "poetic")


@functools.lru_cache(maxsize=None)
def world(num_scenes: int = 16):
  """(manifest path, records, rule-based judge) of a small synthetic world, generated once per session."""
  out = pathlib.Path(tempfile.mkdtemp(prefix="jaxcap_eval_world_"))
  manifest = generate_dataset(out, num_scenes, seed=3)
  records, judge = judge_for_manifest(manifest)
  return manifest, records, judge


def builtin(kind: str, records, name: str | None = None) -> CaptionSet:
  return builtin_captions(name or kind, kind, records)


class ScriptedPairwiseJudge:
  """compare_captions answers from `script(request)`: "a", "b", "tie" or None (a failed judgment)."""

  def __init__(self, script: Callable[[PairwiseRequest], str | None]):
    self.script = script
    self.calls: list[PairwiseRequest] = []

  def compare_captions(self, requests: Sequence[PairwiseRequest]) -> list[PairwiseVerdict]:
    self.calls += list(requests)
    out = []
    for r in requests:
      winner = self.script(r)
      out.append(
        PairwiseVerdict(failed=True, error="scripted failure") if winner is None else PairwiseVerdict(winner=winner)
      )
    return out


class ScriptedAnswerJudge:
  """answer_multiple_choice replies `script(request)` (a letter or any text); None is a failed judgment."""

  def __init__(self, script: Callable[[MultipleChoiceRequest], str | None]):
    self.script = script
    self.calls: list[MultipleChoiceRequest] = []

  def answer_multiple_choice(self, requests: Sequence[MultipleChoiceRequest]) -> list[MultipleChoiceReply]:
    self.calls += list(requests)
    out = []
    for r in requests:
      reply = self.script(r)
      out.append(
        MultipleChoiceReply(failed=True, error="scripted failure")
        if reply is None
        else MultipleChoiceReply(reply=reply)
      )
    return out


def make_world_judge(failure_rate: float = 0.0):
  """A judge factory as `judge.factory` names one ("eval_world:make_world_judge")."""
  from jaxcap.world.judge import RuleBasedJudge

  return RuleBasedJudge(world()[2].scenes, failure_rate=failure_rate)


def make_not_a_judge():
  return object()
