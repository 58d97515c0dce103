"""Captioner sources: where the captions under evaluation come from.

A `CaptionSet` maps image id -> one or more captions (n samples per image; Prism uses all of them, the other
suites use the first). Sources:
  * JSONL of captions (anyone's captioner): one object per line, either
        {"id": "<image id>", "caption": "..."}            (an id repeated: more samples, with duplicates="samples"), or
        {"id": "<image id>", "captions": ["...", "..."]}
    ("image_id" is accepted for "id"). `python -m jaxcap.caption` writes this format for jaxcap / HF checkpoints.
  * a callable `caption_fn(records) -> list[str]`, one caption per record, in order (a thin adapter over a
    jaxcap or HF checkpoint; records carry the image / frame paths);
  * built-ins read from the manifest records: "reference", "teacher:<style>", "student" (the weak caption the
    stored RubiCap rubric was written against) and "empty".
Spec strings (config): "builtin:<name>", "jsonl:<path>" (or a bare path ending in .jsonl), "callable:<module>:<fn>".
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
from typing import Callable, Mapping, Sequence

from jaxcap.data.records import ImageRecord

CaptionFn = Callable[[Sequence[ImageRecord]], list[str]]


@dataclasses.dataclass(frozen=True)
class CaptionSet:
  """Captions of one captioner: image id -> (sample_0, sample_1, ...)."""

  name: str
  captions: Mapping[str, tuple[str, ...]]

  def first(self, records: Sequence[ImageRecord]) -> list[str]:
    """The first sample per record, in record order [N]."""
    return [self.samples(r.id)[0] for r in records]

  def samples(self, image_id: str) -> tuple[str, ...]:
    found = self.captions.get(image_id)
    if not found:
      raise KeyError(
        f"Captioner {self.name!r} has no caption for image {image_id!r}; caption every "
        "image of the manifest (or evaluate on a manifest restricted to the captioned images)."
      )
    return found

  def check_covers(self, records: Sequence[ImageRecord]) -> None:
    missing = [r.id for r in records if not self.captions.get(r.id)]
    if missing:
      raise ValueError(
        f"Captioner {self.name!r} lacks captions for {len(missing)} of {len(records)} images "
        f"(first: {missing[:3]}); caption every image evaluated, or evaluate fewer (`python -m jaxcap.eval "
        "--config.num_images=N` takes the first N manifest images)."
      )


DUPLICATE_POLICIES = ("samples", "error")


def read_caption_jsonl(path: str | os.PathLike, name: str | None = None, *, duplicates: str = "samples") -> CaptionSet:
  """A CaptionSet from a JSONL file (format in the module docstring). An id on several rows adds samples
  (`duplicates="samples"`) or, with "error", raises naming the image and both lines (e.g. an annotator that
  wrote an image twice, whose second caption would otherwise be scored as a sample)."""
  if duplicates not in DUPLICATE_POLICIES:
    raise ValueError(f"duplicates={duplicates!r}: use one of {DUPLICATE_POLICIES}.")
  captions: dict[str, list[str]] = {}
  first_line: dict[str, int] = {}
  with open(path) as f:
    for n, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{n} is not valid JSON ({e}); write one object per line.") from None
      image_id = row.get("id", row.get("image_id"))
      if image_id is None:
        raise ValueError(f"{path}:{n} has no 'id' (keys: {sorted(row)}); give each row the image id.")
      if "captions" in row:
        texts = list(row["captions"])
      elif "caption" in row:
        texts = [row["caption"]]
      else:
        raise ValueError(f"{path}:{n} has neither 'caption' nor 'captions'; add the caption text.")
      if not all(isinstance(t, str) for t in texts):
        raise ValueError(f"{path}:{n}: captions must be strings, got {texts!r}.")
      image_id = str(image_id)
      if image_id in first_line and duplicates == "error":
        raise ValueError(
          f"{path}:{n}: image {image_id!r} already has a caption (line {first_line[image_id]}); keep one row per "
          "image (several samples go in one row's 'captions' list), or set --config.duplicate_captions=samples to "
          "score every row as a sample."
        )
      first_line.setdefault(image_id, n)
      captions.setdefault(image_id, []).extend(texts)
  return CaptionSet(name or os.path.splitext(os.path.basename(path))[0], {k: tuple(v) for k, v in captions.items()})


def write_caption_jsonl(captions: CaptionSet, path: str | os.PathLike) -> None:
  """One row per image with all its samples: {"id", "captions"}."""
  with open(path, "w") as f:
    for image_id, texts in captions.captions.items():
      f.write(json.dumps({"id": image_id, "captions": list(texts)}) + "\n")


def captions_from_fn(
  name: str, caption_fn: CaptionFn, records: Sequence[ImageRecord], *, num_samples: int = 1, batch_size: int = 16
) -> CaptionSet:
  """Calls `caption_fn` on batches of records, `num_samples` times (the function is expected to sample)."""
  if num_samples < 1 or batch_size < 1:
    raise ValueError(f"num_samples={num_samples}, batch_size={batch_size}: both must be >= 1.")
  out: dict[str, list[str]] = {r.id: [] for r in records}
  for _ in range(num_samples):
    for start in range(0, len(records), batch_size):
      batch = list(records[start : start + batch_size])
      texts = caption_fn(batch)
      if len(texts) != len(batch):
        raise ValueError(
          f"caption_fn of {name!r} returned {len(texts)} captions for {len(batch)} images; "
          "it must return exactly one caption per record, in order."
        )
      for record, text in zip(batch, texts):
        out[record.id].append(str(text))
  return CaptionSet(name, {k: tuple(v) for k, v in out.items()})


def builtin_captions(name: str, kind: str, records: Sequence[ImageRecord]) -> CaptionSet:
  """Built-in captioners over the manifest: reference, teacher:<style>, student, empty."""

  def one(record: ImageRecord) -> str:
    if kind == "reference":
      return record.reference_caption
    if kind == "empty":
      return ""
    if kind == "student":
      if record.rubric is None or not record.rubric.student_caption:
        raise ValueError(f"builtin:student needs rubrics with a student caption; image {record.id!r} has none.")
      return record.rubric.student_caption
    if kind.startswith("teacher:"):
      style = kind.split(":", 1)[1]
      if style not in record.teacher_captions:
        raise ValueError(f"builtin:{kind}: image {record.id!r} has teachers {sorted(record.teacher_captions)}.")
      return record.teacher_captions[style]
    raise ValueError(f"Unknown built-in captioner {kind!r}; use reference, teacher:<style>, student or empty.")

  return CaptionSet(name, {r.id: (one(r),) for r in records})


def load_captioner(
  name: str, spec: str, records: Sequence[ImageRecord], *, num_samples: int = 1, duplicates: str = "samples"
) -> CaptionSet:
  """A CaptionSet from a spec string (see module docstring); `duplicates` as `read_caption_jsonl`'s."""
  if spec.startswith("builtin:"):
    return builtin_captions(name, spec[len("builtin:") :], records)
  if spec.startswith("callable:"):
    target = spec[len("callable:") :]
    module, _, attr = target.rpartition(":")
    if not module:
      raise ValueError(f"Captioner {name!r}: {spec!r} should be 'callable:<module>:<function>'.")
    return captions_from_fn(name, getattr(importlib.import_module(module), attr), records, num_samples=num_samples)
  path = spec[len("jsonl:") :] if spec.startswith("jsonl:") else spec
  if not path.endswith(".jsonl") and not spec.startswith("jsonl:"):
    raise ValueError(
      f"Captioner {name!r}: cannot read spec {spec!r}; use builtin:<name>, jsonl:<path> or "
      "callable:<module>:<function>."
    )
  if not os.path.exists(path):
    raise FileNotFoundError(
      f"Captioner {name!r}: no caption file at {path!r}; write it with `python -m jaxcap.caption` or fix the path."
    )
  return read_caption_jsonl(path, name, duplicates=duplicates)
