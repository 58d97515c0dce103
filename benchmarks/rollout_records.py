"""Rollout records' size and write time per recorded step (jaxcap.train.logs.rollout_records), at the embedded default's
batch and at the `:paper` configs' batches.

What a recorded step pays on the training loop's thread: choosing the groups, the host advantages over the step's
batch, building each sampled group's record (rewards, evidence, stop reasons), cutting long strings, and writing
the file (strict JSON, written whole and renamed). The inputs are synthetic but shaped as each config's: its batch
B x G, captions of its typical length (the embedded student's ~22 words; a real student's up to
`sampling.max_new_tokens` = 1024 tokens, ~700 words), and its family's evidence per caption (CapRL: N questions
with their options; RubiCap: its criteria; BalCapRL: claims, reference units and language scores). The reward
families' own cost of collecting the evidence is part of judging and not timed here.

    python -m benchmarks.rollout_records [--repeats 20] [--groups 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

if not __package__:  # run as a file (python benchmarks/rollout_records.py): the repository root, for `benchmarks.*`
  sys.path.append(str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import cpu_model, usable_cores
from jaxcap.data.records import ImageRecord
from jaxcap.rewards.batch import RewardBatch
from jaxcap.train.logs.rollout_records import RolloutRecorder, record_path

WORDS = "red blue green circle square triangle large small left right top bottom near above below the a of".split()

# (label, B, G, words per caption, family, evidence items per caption)
CASES = [
  ("embedded default (caprl)", 8, 8, 22, "caprl", 4),
  ("caprl:paper", 16, 8, 700, "caprl", 8),
  ("rubicap:paper", 64, 4, 700, "rubicap", 12),
  ("balcaprl:paper", 256, 8, 700, "balcaprl", 40),
]


def _text(rng, words: int) -> str:
  return " ".join(rng.choice(WORDS, size=words)) + "."


def _evidence(rng, family: str, k: int) -> dict:
  if family == "caprl":
    options = [_text(rng, 2) for _ in range(5)]
    qs = [{"question": _text(rng, 8), "options": options, "gold": "B", "letter": "B", "correct": True}] * k
    return {"caprl/accuracy": {"questions": qs}}
  if family == "rubicap":
    return {"rubicap/pass_rate": {"criteria": [{"criterion": _text(rng, 14), "weight": 2.0, "passed": True}] * k}}
  claims = [{"claim": _text(rng, 8), "correct": True, "pointable": True}] * k
  units = [{"unit": _text(rng, 6), "covered": False}] * (k // 2)
  language = {"clarity": 8.0, "fluency": 9.0, "coherence": 8.0}
  return {"balcaprl": {"claims": claims, "units": units, "language": language}}


def case(label, b, g, words, family, k, groups: int, repeats: int, directory: Path) -> dict:
  rng = np.random.default_rng(0)
  n = b * g
  names = ("balcaprl/precision", "balcaprl/recall", "balcaprl/linguistic") if family == "balcaprl" else (family,)
  r = len(names)
  captions = [_text(rng, int(words * rng.uniform(0.5, 1.0))) for _ in range(n)]
  evidence = tuple(_evidence(rng, family, k) for _ in range(n))
  rewards = RewardBatch(
    names=names,
    values=rng.random((n, r)).astype(np.float32),
    valid=rng.random((n, r)) > 0.02,
    weights=np.full(r, 1.0 / r, np.float32),
    caption_lengths=np.array([len(c.split()) for c in captions], np.int32),
    reference_lengths=np.full(n, words, np.int32),
    evidence=evidence,
  )
  records = [ImageRecord(id=f"img{i:06d}", image=f"/data/images/img{i:06d}.jpg") for i in range(b)]
  max_tokens = max(16, int(words * 1.4))
  lengths = rng.integers(max_tokens // 2, max_tokens + 1, size=n)
  tokens = np.zeros((n, max_tokens), np.int32)
  tokens[np.arange(n), lengths - 1] = 1  # the stop token ends most captions
  rec = RolloutRecorder(directory, 1, groups, 8000, "Describe this image in detail.", "grpo", (1,))
  rec(1, records, captions, rewards, tokens, lengths)  # warm-up: jax's first dispatch of the estimator
  times = []
  for step in range(2, repeats + 2):
    t0 = time.perf_counter()
    rec(step, records, captions, rewards, tokens, lengths)
    times.append(time.perf_counter() - t0)
  size = record_path(directory, repeats + 1).stat().st_size
  return {"label": label, "B": b, "G": g, "words": words, "bytes": size, "ms": 1e3 * statistics.median(times),
          "ms_min": 1e3 * min(times)}  # fmt: skip


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--repeats", type=int, default=20, help="timed record steps per case (median reported)")
  ap.add_argument("--groups", type=int, default=4, help="logging.rollout_groups")
  args = ap.parse_args()
  print(f"CPU: {cpu_model()}, {usable_cores()} usable cores, load average {os.getloadavg()[0]:.2f} at start")
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    for c in CASES:
      rows.append(case(*c, groups=args.groups, repeats=args.repeats, directory=Path(tmp) / c[0].split()[0]))
  print(f"load average {os.getloadavg()[0]:.2f} at end; logging.rollout_groups={args.groups}")
  print("| config | B x G | caption words | file per recorded step | write time (median / min) |")
  print("| --- | --- | --- | --- | --- |")
  for r in rows:
    size = f"{r['bytes'] / 1024:.1f} KiB"
    print(f"| {r['label']} | {r['B']} x {r['G']} | <= {r['words']} | {size} | {r['ms']:.1f} / {r['ms_min']:.1f} ms |")


if __name__ == "__main__":
  main()
