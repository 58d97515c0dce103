"""The request bodies `benchmarks.judge_server_load` sends the rule-based judge server: good chat requests of the
kinds a CapRL / RubiCap / BalCapRL run sends, one large CapRL judgment, and malformed ones that must get a 4xx."""

from __future__ import annotations

import json


def good_requests(records, count: int) -> list[bytes]:
  """Chat bodies with the structured copy the rule-based server answers from, cycling over primitives."""
  out = []
  for i in range(count):
    r = records[i % len(records)]
    caption = r.reference_caption + f" (sample {i})"
    kind = i % 4
    if kind == 0:
      hint = (
        "answer_multiple_choice",
        dict(caption=caption, question="What colour is the circle?", options=["red", "blue", "green", "cannot answer"]),
      )
    elif kind == 1:
      hint = ("check_criteria", dict(caption=caption, criterion="The caption states: a red circle"))
    elif kind == 2:
      hint = ("split_claims", dict(caption=caption))
    else:
      hint = ("rate_language", dict(caption=caption))
    body = {
      "model": "judge",
      "messages": [{"role": "system", "content": "You are a judge."}, {"role": "user", "content": caption}],
      "temperature": 0.0,
      "max_tokens": 64,
      "jaxcap_request": {"primitive": hint[0], "request": {"image_id": r.id, **hint[1]}},
    }
    out.append(json.dumps(body).encode())
  return out


MAX_BODY_MB = 16


def large_request(record, mb: float) -> bytes:
  """A CapRL judgment of one caption of `mb` MiB (the body twice that: the prompt and the structured copy)."""
  sentence = "a red circle left of a blue square. "
  caption = (sentence * int(mb * 2**20 / (2 * len(sentence)) + 1))[: int(mb * 2**20 / 2)]
  hint = dict(caption=caption, question="What colour is the circle?", options=["red", "blue", "green", "cannot answer"])
  body = {
    "model": "judge",
    "messages": [{"role": "user", "content": caption}],
    "jaxcap_request": {"primitive": "answer_multiple_choice", "request": {"image_id": record.id, **hint}},
  }
  return json.dumps(body).encode()


BAD = [
  b"{not json",
  json.dumps({"model": "judge", "messages": "hi"}).encode(),
  json.dumps(
    {
      "model": "judge",
      "messages": [{"role": "user", "content": "x"}],
      "jaxcap_request": {"primitive": "check_criteria", "request": {"image_id": 7}},
    }
  ).encode(),
  b'{"model": "judge", "messages": [{"role": "user", "content": "' + b"x" * (MAX_BODY_MB * 2**20) + b'"}]}',  # > limit
]
