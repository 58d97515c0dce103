"""Every record's media decoded once before training starts, so that a truncated JPEG, a missing frame or a
decompression bomb is found before any compute is spent, not when its batch loads (and again at every restart).

Files are decoded fully (`Image.load`, which reads every byte, unlike `Image.open`) on a thread pool, with a
progress bar. Policy `bad_media`: "fail" raises one `MediaError` listing every bad record (id, file, reason);
"skip" drops those records, lists them in `<workdir>/media_errors.jsonl` (one JSON object per line) and logs
their count.
"""

from __future__ import annotations

import dataclasses
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Mapping, Sequence

from jaxcap.data.manifest import ManifestError
from jaxcap.data.records import ImageRecord
from jaxcap.multihost import is_lead_process

BAD_MEDIA_POLICIES = ("fail", "skip")
ERRORS_FILE = "media_errors.jsonl"
MAX_LISTED = 100  # bad records written into the error message itself; the errors file lists all of them


class MediaError(ManifestError):
  """Records whose media cannot be decoded, each named with its file and reason."""


@dataclasses.dataclass(frozen=True)
class BadMedia:
  """One record that cannot be trained on: its `split`, `id`, the first `file` that failed and why."""

  split: str
  id: str
  file: str
  reason: str

  def to_json(self) -> dict[str, str]:
    return dataclasses.asdict(self)

  def line(self) -> str:
    return f"{self.split} record {self.id!r}: {self.file}: {self.reason}"


def media_files(record: ImageRecord) -> tuple[str, ...]:
  """The files training decodes for `record`: its frames for a clip, else its image (or video file)."""
  return tuple(record.frames) if record.frames else (record.image,)


def exists_problem(path: str) -> str | None:
  """Why `path` cannot be used when files are only checked to exist (data.check_media=False)."""
  return None if os.path.isfile(path) else "no such file"


def find_bad_media(
  splits: Mapping[str, Sequence[ImageRecord]],
  *,
  workers: int | None = None,
  progress: bool = True,
  decode: Callable[[str], str | None] = exists_problem,
) -> list[BadMedia]:
  """Every record of `splits` (name -> records) with a file that does not decode, in split and record order.

  Each distinct file is decoded once, `workers` at a time (default: one per core, at most 32; Pillow releases
  the GIL while it decodes)."""
  paths = list(dict.fromkeys(p for records in splits.values() for r in records for p in media_files(r)))
  problems: dict[str, str | None] = {}
  workers = workers or min(32, os.cpu_count() or 1)
  from tqdm.auto import tqdm

  bar = tqdm(
    total=len(paths),
    desc="checking media",
    unit="file",
    disable=not (progress and is_lead_process()),
    dynamic_ncols=True,
    mininterval=1.0,
  )
  window = max(256, 64 * workers)  # bounded submission: a million files are not a million pending futures
  with bar, ThreadPoolExecutor(workers, thread_name_prefix="media-check") as pool:
    for start in range(0, len(paths), window):
      chunk = paths[start : start + window]
      for path, problem in zip(chunk, pool.map(decode, chunk)):
        problems[path] = problem
        bar.update(1)
  bad = []
  for split, records in splits.items():
    for r in records:
      failed = next((p for p in media_files(r) if problems[p] is not None), None)
      if failed is not None:
        bad.append(BadMedia(split, r.id, failed, problems[failed]))
  return bad


def _has_bad_media(record: ImageRecord, bad_files: set[str]) -> bool:
  return any(p in bad_files for p in media_files(record))


def check_record_media(
  splits: Mapping[str, Sequence[ImageRecord]],
  *,
  policy: str = "fail",
  workdir: str | os.PathLike | None = None,
  decode: Callable[[str], str | None] | None = None,
  workers: int | None = None,
  progress: bool = True,
) -> dict[str, list[ImageRecord]]:
  """`splits` (name -> records) with the records whose media does not decode handled by `policy` ("fail" or
  "skip", see the module docstring). `decode(path)` says why a file cannot be used (None when it decodes): the
  decoders training uses, `jaxcap.processing.media.decode_problem`; None only checks that the files exist (policy
  applies too)."""
  if policy not in BAD_MEDIA_POLICIES:
    raise ValueError(f"data.bad_media={policy!r}: use one of {BAD_MEDIA_POLICIES}.")
  errors_path = Path(workdir) / ERRORS_FILE if workdir is not None else None
  check = decode or exists_problem
  bad = find_bad_media(splits, workers=workers, progress=progress and decode is not None, decode=check)
  total = sum(len(records) for records in splits.values())
  if errors_path is not None and is_lead_process():
    if bad:
      errors_path.parent.mkdir(parents=True, exist_ok=True)
      errors_path.write_text("".join(json.dumps(b.to_json()) + "\n" for b in bad))
    else:
      errors_path.unlink(missing_ok=True)  # a list from an earlier check of files since fixed would mislead
  if not bad:
    return {name: list(records) for name, records in splits.items()}
  where = f", all listed in {errors_path}" if errors_path is not None else ""
  if policy == "fail":
    listed = "\n".join("  " + b.line() for b in bad[:MAX_LISTED])
    more = f"\n  ... and {len(bad) - MAX_LISTED} more" if len(bad) > MAX_LISTED else ""
    raise MediaError(
      f"{len(bad)} of {total} records have media that cannot be decoded{where}:\n{listed}{more}\n"
      "Fix or remove these files (relative paths are resolved against the manifest's folder), or set "
      "--config.data.bad_media=skip to train on the other records."
    )
  bad_files = {b.file for b in bad}
  kept = {name: [r for r in records if not _has_bad_media(r, bad_files)] for name, records in splits.items()}
  emptied = [name for name, records in splits.items() if records and not kept[name]]
  if emptied:
    raise MediaError(
      f"every {' and every '.join(emptied)} record has media that cannot be decoded{where}; fix the files first."
    )
  if is_lead_process():
    counts = ", ".join(f"{sum(b.split == name for b in bad)} of {len(v)} {name}" for name, v in splits.items() if v)
    noun = "record" if len(bad) == 1 else "records"
    print(f"media check: skipped {len(bad)} {noun} whose media does not decode ({counts}){where}", flush=True)
  return kept
