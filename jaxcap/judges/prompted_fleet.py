"""The judge fleet behind prompt templates: each judgment's prompt rendered, its image attached where the role
sends images, the calls asked of the `JudgeFleet`, and the failures that happen before any request (an image that
cannot be read) counted with the fleet's. `HttpJudge` builds the protocol's primitives on it."""

from __future__ import annotations

import base64
import collections
import dataclasses
import functools
import mimetypes
import os
import pathlib
import threading
from typing import Any, Callable, Mapping, Sequence

from jaxcap.data.records import ImageRecord
from jaxcap.judges import parsing
from jaxcap.judges.fleet import JudgeCall, JudgeFleet, Outcome
from jaxcap.judges.prompts import PromptLibrary

# primitive -> the fleet role that answers it
ROLES = {
  "answer_multiple_choice": "answerer",
  "check_criteria": "judge",
  "write_criteria": "rubric_writer",
  "split_claims": "judge",
  "verify_claims": "verifier",
  "match_reference_units": "judge",
  "rate_language": "judge",
  "compare_captions": "judge",
  "score_likert": "judge",
  "answer_visual_questions": "curator",
}


class PromptedFleet:
  """Renders, attaches images, asks a `JudgeFleet`, and counts every failed judgment by kind.

  images: image id -> image file path, for roles with `send_images` (build it with `images_from_records`).
  prompts: a PromptLibrary (defaults to the shipped templates in jaxcap/judges/prompts/).
  """

  def __init__(
    self,
    fleet: JudgeFleet,
    *,
    images: Mapping[str, str | os.PathLike] | None = None,
    prompts: PromptLibrary | None = None,
  ):
    self.fleet = fleet
    self.images = dict(images or {})
    self.prompts = prompts or PromptLibrary()
    self._lock = threading.Lock()
    self._local_failures: collections.Counter[str] = collections.Counter()  # failed before reaching the fleet
    self._last_local_error = ""

  # -- accounting -----------------------------------------------------------------------------------------

  def failures_by_kind(self) -> dict[str, int]:
    """Failed judgments by kind (auth, timeout, connection, http_status, parse, image, ...), cumulative."""
    out = self.fleet.failures_by_kind()
    with self._lock:
      for kind, count in self._local_failures.items():
        out[kind] = out.get(kind, 0) + count
    return out

  def judgment_counts(self) -> tuple[int, int, dict[str, int]]:
    """(judgments tried, judgments failed, failed by kind), cumulative; what the failure budget reads."""
    asked, failed, _ = self.fleet.judgment_counts()
    with self._lock:
      local = sum(self._local_failures.values())
    return asked + local, failed + local, self.failures_by_kind()

  def unsent_judgments(self) -> int:
    """Failed judgments no endpoint took (breakers open through a probe), cumulative; masked, and left out of
    `judgment_counts`, which counts the judgments that were tried."""
    return self.fleet.unsent_judgments()

  def last_failure(self) -> str:
    """The error of the last failed judgment ("" if none)."""
    return self.fleet.last_error or self._last_local_error

  # -- plumbing -------------------------------------------------------------------------------------------

  def _ask(
    self,
    primitive: str,
    template: str,
    items: Sequence[tuple[Any, dict[str, Any], Callable[[str], Any]]],
    *,
    image_ids: Sequence[str | None] | None = None,
  ) -> list[Outcome]:
    """items: (request, template variables, parse) per judgment; returns one Outcome per item."""
    role = ROLES[primitive]
    calls, slots, outcomes = self.calls(primitive, template, items, image_ids=image_ids)
    for i, outcome in zip(slots, self.fleet.judge(role, calls) if calls else []):
      outcomes[i] = outcome
    return outcomes

  def calls(
    self,
    primitive: str,
    template: str,
    items: Sequence[tuple[Any, dict[str, Any], Callable[[str], Any]]],
    *,
    image_ids: Sequence[str | None] | None = None,
    role: str | None = None,
  ) -> tuple[list[JudgeCall], list[int], list[Outcome | None]]:
    """The fleet calls of `items`: (calls, the item index of each call, outcomes with the items that failed
    before any request filled in). `role` (default: the primitive's) decides whether images are attached."""
    config = self.fleet.role_config(role or ROLES[primitive])
    schema = parsing.SCHEMAS.get(template)
    calls, slots, outcomes = [], [], [None] * len(items)
    completion = self.prompts.is_completion(template)
    for i, (request, variables, parse) in enumerate(items):
      if completion:  # a raw prompt (no turns to attach an image to): text-only roles, as the released answerer
        hint = {"primitive": primitive, "request": dataclasses.asdict(request)}
        calls.append(JudgeCall((), parse, schema, hint, prompt=self.prompts.render_completion(template, **variables)))
        slots.append(i)
        continue
      messages = self.prompts.render(template, **variables)
      image_id = image_ids[i] if image_ids is not None else None
      if image_id is not None and config.send_images:
        try:
          messages[-1] = {
            "role": "user",
            "content": [
              {"type": "text", "text": messages[-1]["content"]},
              {"type": "image_url", "image_url": {"url": self._data_url(image_id)}},
            ],
          }
        except (KeyError, OSError) as e:
          outcomes[i] = Outcome(
            failed=True, error=f"image: {e.args[0] if isinstance(e, KeyError) else e}", cause="image"
          )
          with self._lock:
            self._local_failures["image"] += 1
            self._last_local_error = outcomes[i].error
          continue
      hint = {"primitive": primitive, "request": dataclasses.asdict(request)}
      calls.append(JudgeCall(tuple(messages), parse, schema, hint))
      slots.append(i)
    return calls, slots, outcomes

  def _data_url(self, image_id: str) -> str:
    if image_id not in self.images:
      raise KeyError(
        f"No image path for image id {image_id!r}; pass HttpJudge(images={{id: path}}) "
        "(images_from_records) or turn send_images off for this role."
      )
    return _encode_image(str(self.images[image_id]))

  @staticmethod
  def _results(outcomes: Sequence[Outcome], make: Callable[[Any], Any], result_type: type) -> list:
    return [result_type(failed=True, error=o.error) if o.failed else make(o.value) for o in outcomes]


@functools.lru_cache(maxsize=256)
def _encode_image(path: str) -> str:
  mime = mimetypes.guess_type(path)[0] or "image/png"
  return f"data:{mime};base64," + base64.b64encode(pathlib.Path(path).read_bytes()).decode()


def images_from_records(records: Sequence[ImageRecord], root: str | os.PathLike = ".") -> dict[str, str]:
  """image id -> absolute image path, for records whose `image` is set (relative paths resolved at root)."""
  base = pathlib.Path(root)
  return {r.id: str(base / r.image) for r in records if r.image}
