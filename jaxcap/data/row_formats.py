"""The row formats a manifest may hold, as jaxcap rows: jaxcap's own, and the released CapRL / CapRL++ verl rows.

A verl row has `prompt` (chat messages: the user turn's text becomes the record's own prompt), `images` or
`videos` (paths, or dicts {"image": path} / {"video": path} / {"bytes": ..., "path": ...}),
`reward_model: {"ground_truth": [...]}` and optionally `extra_info`. Each ground-truth item is a dict {"question", "choices", "answer": "C"} or a
[question_text, "C"] pair whose text holds option lines "   - A) Red"; the answer is a letter. A "Can not answer
based on the caption" option is dropped (jaxcap adds its own), and a label written into an option ("A) Red",
"A. Red", "(A) Red") is stripped, so no option carries its original letter once options are shuffled.
"""

from __future__ import annotations

import json
import re
import string
from typing import Any, Mapping

# an option line of a pair's question text: "   - A) Red" (the released parser: `-\s*([A-F])\)\s*(.+)`), or "- A. Red"
_OPTION_LINE = re.compile(r"^-\s*([A-Z])[).]\s*(.+)$")
# a label written into an option: "A) Red", "(A) Red", "A. Red" (a "." label needs a space: "A.M. radio" is no label)
_LABEL = re.compile(r"^(?:\(([A-Z])\)\s*|([A-Z])\)\s*|([A-Z])\.\s+)(.+)$", re.S)
_LETTER = re.compile(r"^\(?([A-Za-z])\)?\.?$")
_CANNOT_ANSWER = re.compile(r"^can\s*not\s+answer\b", re.I)
BYTES_UNSUPPORTED = (
  "is stored as bytes (a Hugging Face Image / Video column; `save_to_disk` embeds its files), which jaxcap does not "
  "read yet: write the images to files once (e.g. `for i, row in enumerate(ds): row['image'].save(f'images/{i}.png')`) "
  "and give the rows their paths ('images/0.png': relative to the manifest's folder, or absolute) as a plain string "
  "column"
)


def is_verl_row(row: Any) -> bool:
  return isinstance(row, Mapping) and "reward_model" in row


def as_jaxcap_row(row: Any, number: int) -> Any:
  """`row` in jaxcap's format: a verl row converted (`number` is its id when it has none), a jaxcap row with its
  media given as {"path": ...} dicts (a Hugging Face Image column) flattened to paths. Raises ValueError."""
  if is_verl_row(row):
    return verl_row(row, number)
  if isinstance(row, Mapping) and any(isinstance(row.get(k), Mapping) for k in ("image", "video")):
    row = dict(row)
    for key in ("image", "video"):
      if isinstance(row.get(key), Mapping):
        row[key] = _one_path(row[key], key)
  return row


def verl_row(row: Mapping[str, Any], number: int) -> dict[str, Any]:
  """One released CapRL / CapRL++ row as a jaxcap row: id `extra_info.index`, else `id`, else `number`."""
  extra = row.get("extra_info") if isinstance(row.get("extra_info"), Mapping) else {}
  row_id = next((v for v in (extra.get("index"), row.get("id")) if v is not None), number)
  out: dict[str, Any] = {"id": str(row_id), **_media(row, extra)}
  if row.get("prompt"):
    out["prompt"] = row["prompt"]  # chat messages: ImageRecord keeps the user turn's text
  reward = row.get("reward_model")
  if not isinstance(reward, Mapping):
    raise ValueError(f"'reward_model' must be an object with a 'ground_truth' list, not {type(reward).__name__}")
  truth = reward.get("ground_truth") or []
  if isinstance(truth, str):  # some exports store the list as a JSON string
    try:
      truth = json.loads(truth)
    except json.JSONDecodeError:
      raise ValueError("reward_model.ground_truth is a string that is not a JSON list of questions") from None
  if isinstance(truth, Mapping):
    truth = [truth]
  if not isinstance(truth, list):
    raise ValueError(f"reward_model.ground_truth must be a list of questions, not {type(truth).__name__}")
  out["questions"] = [_question(item, f"{row_id}/q{k}", k) for k, item in enumerate(truth)]
  return out


def _question(item: Any, qid: str, k: int) -> dict[str, Any]:
  """One ground-truth item as a jaxcap question: options in their given order, `answer` the lettered option's text."""
  if isinstance(item, Mapping):
    question = str(item.get("question") or "").strip()
    texts = [str(c).strip() for c in item.get("choices") or item.get("options") or ()]
    if not texts:
      raise ValueError(f"ground_truth[{k}] ({question[:60]!r}) has no 'choices'; give its options as a list")
    labelled = [_LABEL.match(t) for t in texts]
    if all(labelled):  # "A) Red" as the released code writes it: the written letter counts, as there
      options = [(next(g for g in m.groups()[:3] if g), m.group(4).strip()) for m in labelled]
    else:  # plain, or some labelled: positional letters (labels are stripped below when all but a "cannot" have one)
      options = list(zip(string.ascii_uppercase, texts))
    answer = item.get("answer")
  elif isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], str):
    question, options = _parse_question_text(item[0], k)
    answer = item[1]
  else:
    raise ValueError(
      f"ground_truth[{k}] is {type(item).__name__} {str(item)[:80]!r}: use {{'question', 'choices', 'answer': "
      "'C'}} or a [question_with_option_lines, 'C'] pair"
    )
  letters = [letter for letter, _ in options]
  if len(set(letters)) != len(letters):
    raise ValueError(f"ground_truth[{k}] ({question[:60]!r}) labels two options with one letter: {letters}")
  texts = _strip_labels([t for _, t in options])  # "- A) A. Red": the released video set's extra label
  by_letter = dict(zip(letters, texts))
  match = _LETTER.match(str(answer).strip()) if answer is not None else None
  letter = match.group(1).upper() if match else None
  if letter not in by_letter:
    raise ValueError(
      f"ground_truth[{k}] ({question[:60]!r}): answer {answer!r} is not the letter of one of its options "
      f"{''.join(letters)}; fix the answer or the options"
    )
  if _CANNOT_ANSWER.match(by_letter[letter]):
    raise ValueError(
      f"ground_truth[{k}] ({question[:60]!r}): its answer is the 'cannot answer' option, which jaxcap adds itself; "
      "drop this question"
    )
  kept = [t for t in texts if not _CANNOT_ANSWER.match(t)]
  return {"id": qid, "question": question, "options": kept, "answer": by_letter[letter]}


def _parse_question_text(text: str, k: int) -> tuple[str, list[tuple[str, str]]]:
  """(question, [(letter, option)]) of a pair's text: its lines before the first option line are the question."""
  question, options = [], []
  for line in text.splitlines():
    m = _OPTION_LINE.match(line.strip())
    if m:
      options.append((m.group(1), m.group(2).strip()))
    elif not options and line.strip():
      question.append(line.strip())
  if not options:
    raise ValueError(f"ground_truth[{k}] ({text[:60]!r}) has no option lines such as '   - A) Red'")
  return "\n".join(question), options


def _strip_labels(texts: list[str]) -> list[str]:
  """The texts without their "A) " / "A. " / "(A) " labels when every one (but a "cannot answer") has one."""
  labelled = [_LABEL.match(t) for t in texts]
  if not all(m or _CANNOT_ANSWER.match(t) for m, t in zip(labelled, texts)):
    return texts
  return [m.group(4).strip() if m else t for m, t in zip(labelled, texts)]


def _media(row: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
  """The jaxcap media fields of a verl row: one image, one video (a path or a list of frame paths), or none."""
  images, videos = _as_list(row.get("images")), _as_list(row.get("videos"))
  if images and videos:
    raise ValueError("has both 'images' and 'videos'; give one of them per row")
  for key, items in (("images", images), ("videos", videos)):
    if len(items) > 1:
      raise ValueError(f"has {len(items)} {key}; a jaxcap record holds one image or video, so split the row")
  if images:
    path = _one_path(images[0], "image")
    if isinstance(path, list):
      raise ValueError("gives an image as a list of paths; put a clip's frames in 'videos'")
    return {"image": path}
  if videos:
    path = _one_path(videos[0], "video")
    return {"frames": path} if isinstance(path, list) else {"video": path}
  return {"video": extra["video_path"]} if isinstance(extra.get("video_path"), str) else {}


def _one_path(value: Any, what: str) -> str | list[str]:
  """A path (or a clip's frame paths) from a path string or a {"image" / "video" / "path": ...} dict. Bytes are
  refused: their `path`, when there is one, is the original file's name only, not where it is."""
  if isinstance(value, Mapping):
    if value.get("bytes"):
      raise ValueError(f"its {what} {BYTES_UNSUPPORTED}")
    value = next((value[k] for k in ("image", "video", "path") if value.get(k)), None)
  if isinstance(value, (list, tuple)) and value and all(isinstance(p, str) for p in value):
    return [p.removeprefix("file://") for p in value]
  if not isinstance(value, str) or not value:
    raise ValueError(f"its {what} {str(value)[:80]!r} is not a path nor a dict holding one")
  return value.removeprefix("file://")


def _as_list(value: Any) -> list[Any]:
  return [] if value is None else list(value) if isinstance(value, (list, tuple)) else [value]
