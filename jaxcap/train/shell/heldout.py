"""Held-out evaluation during a run, on greedy captions: caption-only QA accuracy over every question of each
image, the run's own reward exactly as RL optimises it (length mask included), and caption length."""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import numpy as np

from jaxcap.data.records import ImageRecord
from jaxcap.multihost import is_lead_process
from jaxcap.rewards.batch import RewardFunction
from jaxcap.sampling import Sampler, SamplingConfig
from jaxcap.train.rollouts.batching import Batcher
from jaxcap.train.logs.metrics import to_json
from jaxcap.train.logs.reward_metrics import weighted_mean
from jaxcap.train.logs.rollout_records import sample_rewards

# Held-out QA: every question of each image (CapRL's paper preset), whatever the run's reward.
HELDOUT_QA = {"caprl": {"preset": "paper", "questions_per_caption": 64, "seed": 12345}}


@dataclasses.dataclass
class HeldOutEval:
  """Greedy `captions` of a policy and their `evaluate`-ion, logged through `log(phase, step, metrics)`."""

  sampler: Sampler
  batcher: Batcher
  greedy: SamplingConfig
  qa: RewardFunction | None  # caption-only QA over every question (CapRL, paper preset); None: no judge to ask
  reward: RewardFunction  # the run's own reward
  mesh: Any
  workdir: Path
  batch_size: int
  log: Callable[[str, int, dict], None]  # (phase, step, metrics)

  def captions(self, params, records: Sequence[ImageRecord], batch_size: int) -> tuple[list[str], list[int]]:
    """Greedy captions of `records` (every process passes the same records) and their lengths in tokens.

    Pipelined: the next batch's images are decoded and processed on a host thread while the device samples this
    one, and a batch's captions are copied and decoded only after the next batch's rollout was dispatched."""
    captions, lengths = [], []
    chunks = [records[i : i + batch_size] for i in range(0, len(records), batch_size)]
    prepare = lambda chunk: self.sampler.bucket(self.batcher.inputs(chunk))

    def collect(out):
      captions.extend(out.text)
      lengths.extend(out.host_lengths.tolist())

    with jax.set_mesh(self.mesh), ThreadPoolExecutor(1, thread_name_prefix="heldout") as pool:
      ahead = pool.submit(prepare, chunks[0]) if chunks else None
      previous = None
      for k in range(len(chunks)):
        batch = ahead.result()
        ahead = pool.submit(prepare, chunks[k + 1]) if k + 1 < len(chunks) else None
        out = self.sampler(batch, jax.random.key(0), num_samples=1, sampling=self.greedy, params=params)
        if previous is not None:
          collect(previous)
        previous = out
      if previous is not None:
        collect(previous)
    return captions, lengths

  def evaluate(self, params, records: Sequence[ImageRecord], phase: str, step: int, tag: str = ""):
    """(metrics, greedy captions) of the policy `params` on `records`; with a `tag` the captions are also written to
    workdir/captions/<phase>_<tag>.jsonl (for `python -m jaxcap.eval --captioner NAME=jsonl:PATH`)."""
    if not records:
      return {}, []
    captions, lengths = self.captions(params, records, self.batch_size)
    own = self.reward(captions, records, step=0)
    metrics = {}
    if self.qa is not None:
      qa = self.qa(captions, records, step=0)
      answered = qa.valid[:, 0]  # NaN (null in the logs) when no judgment was valid: nothing was measured
      metrics["eval/qa_accuracy"] = float(qa.values[answered, 0].mean()) if answered.any() else float("nan")
    if own.valid.any(axis=0).all():  # not, e.g. no RubiCap reward before rubrics are written against the policy
      metrics["eval/reward"] = weighted_mean(own.values, own.valid, own.weights)
    metrics.update({"eval/length": float(np.mean(lengths)), "eval/words": float(own.caption_lengths.mean())})
    metrics.update({"eval/" + k.replace("/", "_"): v for k, v in own.extras.items()})
    for k, name in enumerate(own.names):
      if own.valid[:, k].any():
        metrics[f"eval/{name}"] = float(own.values[own.valid[:, k], k].mean())
    self.log(phase, step, metrics)
    if tag and is_lead_process():
      out = self.workdir / "captions"
      out.mkdir(exist_ok=True)
      # with each image's scores, for jaxcap.inspect's SFT-vs-RL view (jaxcap.eval reads id and caption only)
      scores = {"qa_accuracy": np.where(qa.valid[:, 0], qa.values[:, 0], np.nan), "reward": sample_rewards(own)}
      with open(out / f"{phase}_{tag}.jsonl", "w") as f:
        for i, (rec, cap) in enumerate(zip(records, captions)):
          row = {"id": rec.id, "caption": cap, "words": int(own.caption_lengths[i])}
          f.write(to_json(row | {k: float(v[i]) for k, v in scores.items()}) + "\n")
    if is_lead_process():
      from tqdm.auto import tqdm

      tqdm.write(f"eval {phase} step {step}: " + ", ".join(f"{k}={v:.4g}" for k, v in metrics.items()))
    return metrics, captions
