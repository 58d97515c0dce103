"""Parsing judge replies: option letters, JSON objects checked against a small schema, 1-10 scores.

Every parser raises `ReplyParseError` (with the reply quoted) when the reply does not give what was asked;
the fleet retries such replies and, after its retries, reports a failed judgment — never a default value.
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping, Sequence

from jaxcap.judges.protocol import option_labels

LETTERS = "ABCDEFGHI"
_FENCE_RE = re.compile(r"```(?:json)?\s*(.*?)```", re.S)
_PREFIX_RE = re.compile(r"^\s*(?:the\s+)?(?:correct\s+)?(?:answer|option)\s*(?:is)?\s*[:\-]?\s*", re.I)


class ReplyParseError(ValueError):
  """The judge's reply does not contain the requested answer."""


def _quote(reply: str, limit: int = 120) -> str:
  return repr(reply if len(reply) <= limit else reply[:limit] + "...")


def first_letter(reply: str) -> str:
  """The first capital A-I anywhere in the reply, or '' when there is none: the released CapRL servers' reading
  (`parse_easy`) of an answer that follows the pre-filled "The answer is"; '' is an answer that picks nothing."""
  match = re.search(r"[A-I]", reply)
  return match.group(0) if match else ""


def parse_letter(reply: str, options: Sequence[str], labels: Sequence[str] = ()) -> str:
  """The option label a reply picks: a standalone label (first one; labels default to A, B, C, ... by position),
  or the exact text of an option."""
  labels = option_labels(len(options), labels)
  valid = "".join(labels)
  stripped = _PREFIX_RE.sub("", reply.strip())
  # Only letters of this question's options count, so the pronoun "I" is not read as option I of four.
  match = re.search(rf"(?<![A-Za-z])([{valid}])(?![A-Za-z])", stripped)
  if match:
    return match.group(1)
  text = stripped.strip().strip(".:)(\"' ").lower()
  for letter, option in zip(valid, options):
    if text == option.strip().lower():
      return letter
  raise ReplyParseError(f"No option letter {valid[0]}-{valid[-1]} or option text in reply {_quote(reply)}.")


def extract_json(reply: str) -> Any:
  """The first JSON value in a reply: the whole reply, a ```json fence, or the first balanced {...}."""
  candidates = [reply.strip()] + [m.strip() for m in _FENCE_RE.findall(reply)]
  start = reply.find("{")
  if start >= 0:
    depth, in_string, escaped = 0, False, False
    for end in range(start, len(reply)):
      ch = reply[end]
      if in_string:
        escaped = ch == "\\" and not escaped
        if ch == '"' and not escaped:
          in_string = False
        continue
      if ch == '"':
        in_string = True
      elif ch == "{":
        depth += 1
      elif ch == "}":
        depth -= 1
        if depth == 0:
          candidates.append(reply[start : end + 1])
          break
  for text in candidates:
    try:
      return json.loads(text)
    except (json.JSONDecodeError, ValueError):
      continue
  raise ReplyParseError(f"No JSON object in reply {_quote(reply)}.")


def _check(value: Any, schema: Mapping[str, Any], where: str) -> Any:
  """Validates and coerces `value` against the subset of JSON schema the prompts use."""
  kind = schema.get("type")
  if kind == "object":
    if not isinstance(value, dict):
      raise ReplyParseError(f"{where}: expected an object, got {_quote(json.dumps(value))}.")
    out = {}
    for key, sub in schema.get("properties", {}).items():
      if key in value:
        out[key] = _check(value[key], sub, f"{where}.{key}")
      elif key in schema.get("required", ()):
        raise ReplyParseError(f"{where}: missing key {key!r} in {_quote(json.dumps(value))}.")
    return out
  if kind == "array":
    if not isinstance(value, list):
      raise ReplyParseError(f"{where}: expected a list, got {_quote(json.dumps(value))}.")
    return [_check(v, schema.get("items", {}), f"{where}[{i}]") for i, v in enumerate(value)]
  if kind == "boolean":
    if isinstance(value, bool):
      return value
    if isinstance(value, str) and value.strip().lower() in ("true", "yes", "false", "no"):
      return value.strip().lower() in ("true", "yes")
    raise ReplyParseError(f"{where}: expected true/false, got {_quote(json.dumps(value))}.")
  if kind in ("integer", "number"):
    try:
      number = float(value)
    except (TypeError, ValueError):
      raise ReplyParseError(f"{where}: expected a number, got {_quote(json.dumps(value))}.") from None
    lo, hi = schema.get("minimum"), schema.get("maximum")
    if (lo is not None and number < lo) or (hi is not None and number > hi) or number != number:
      raise ReplyParseError(f"{where}: {number} outside [{lo}, {hi}].")
    return number
  if kind == "string":
    if not isinstance(value, str):
      raise ReplyParseError(f"{where}: expected a string, got {_quote(json.dumps(value))}.")
    if "enum" in schema and value.strip().lower() not in schema["enum"]:
      raise ReplyParseError(f"{where}: {value!r} is not one of {schema['enum']}.")
    return value.strip().lower() if "enum" in schema else value
  return value


def parse_json_reply(reply: str, schema: Mapping[str, Any]) -> dict[str, Any]:
  """The reply's JSON object, validated against `schema` (types, required keys, ranges, enums)."""
  return _check(extract_json(reply), schema, "reply")


def parse_flags(reply: str, schema: Mapping[str, Any], key: str, count: int) -> list[Any]:
  """A list under `key` that must have exactly `count` entries (one per claim / unit)."""
  values = parse_json_reply(reply, schema)[key]
  if len(values) != count:
    raise ReplyParseError(f"reply.{key} has {len(values)} entries for {count} items; need one per item.")
  return values


# Schemas sent as response_format (structured output) and used to validate replies.
def _obj(properties: Mapping[str, Any]) -> dict[str, Any]:
  return {"type": "object", "properties": dict(properties), "required": list(properties)}


SCORE_1_10 = {"type": "integer", "minimum": 1, "maximum": 10}
SCHEMAS: dict[str, dict[str, Any]] = {
  "rubicap_check_criterion": _obj({"passed": {"type": "boolean"}}),
  "rubicap_write_criteria": _obj(
    {
      "criteria": {
        "type": "array",
        "items": _obj(
          {"text": {"type": "string"}, "severity": {"type": "string", "enum": ["critical", "important", "minor"]}}
        ),
      }
    }
  ),
  "balcaprl_split_claims": _obj({"claims": {"type": "array", "items": {"type": "string"}}}),
  "balcaprl_verify_claims": _obj(
    {"verdicts": {"type": "array", "items": _obj({"correct": {"type": "boolean"}, "pointable": {"type": "boolean"}})}}
  ),
  "balcaprl_coverage": _obj({"covered": {"type": "array", "items": {"type": "boolean"}}}),
  "balcaprl_rate_language": _obj({"clarity": SCORE_1_10, "fluency": SCORE_1_10, "coherence": SCORE_1_10}),
  "likert_direct": _obj({"score": SCORE_1_10}),
  "likert_reference": _obj({"score": SCORE_1_10}),
  "pairwise": _obj({"winner": {"type": "string", "enum": ["a", "b", "tie"]}}),
}
