"""RubiCap: reward = weighted pass rate of the image's rubric, sum_i w_i * pass_i / sum_i w_i."""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Sequence

import numpy as np

from jaxcap.judges.protocol import CriterionRequest, Judge
from jaxcap.rewards.batch import RewardBatch, make_batch
from jaxcap.data.records import ImageRecord, align_records
from jaxcap.rewards.families import RLStart, reward_family
from jaxcap.rewards.rubric import RubricStore, RubricSynthesisConfig, jobs_from_records


@dataclasses.dataclass(frozen=True)
class RubiCapConfig:
  # Share of the rubric's weight that must be judged (not failed) for a valid reward; the pass rate is
  # then taken over the judged criteria. 1.0 = any failed criterion masks the caption's reward.
  min_judged_weight_fraction: float = 1.0
  name: str = "rubicap/pass_rate"


class RubiCapReward:
  """Callable reward [N, 1]. Rubrics come from the records, else from `store` by image id."""

  def __init__(self, judge: Judge, config: RubiCapConfig = RubiCapConfig(), store: RubricStore | None = None):
    self.judge = judge
    self.config = config
    self.store = store
    self.names = (config.name,)

  def _rubric(self, record: ImageRecord):
    if record.rubric is not None:
      return record.rubric
    return self.store.load(record.id) if self.store is not None else None

  def __call__(
    self, captions: Sequence[str], records: Sequence[ImageRecord], *, step: int = 0, first: int = 0
  ) -> RewardBatch:
    records = align_records(captions, records)
    requests, owners, weights = [], [], []
    total_weight = np.zeros(len(captions))
    failed = collections.Counter()
    for i, (caption, record) in enumerate(zip(captions, records)):
      rubric = self._rubric(record)
      if rubric is None or not rubric.criteria:
        failed["missing_rubric"] += 1
        continue
      for criterion in rubric.criteria:
        requests.append(CriterionRequest(record.id, caption, criterion.text))
        owners.append(i)
        weights.append(criterion.weight)
        total_weight[i] += criterion.weight
    verdicts = self.judge.check_criteria(requests) if requests else []
    passed = np.zeros(len(captions))
    judged = np.zeros(len(captions))
    checked: list[list[dict]] = [[] for _ in captions]  # evidence: each criterion, its weight and verdict
    for request, owner, weight, verdict in zip(requests, owners, weights, verdicts):
      checked[owner].append(
        {"criterion": request.criterion, "weight": weight, "passed": None if verdict.failed else bool(verdict.passed)}
      )
      if verdict.failed:
        failed["check_criteria"] += 1
        continue
      judged[owner] += weight
      passed[owner] += weight * verdict.passed
    valid = (judged > 0) & (judged >= self.config.min_judged_weight_fraction * total_weight - 1e-9)
    rate = np.divide(passed, judged, out=np.zeros_like(passed), where=judged > 0)
    evidence = [{self.names[0]: {"criteria": c}} for c in checked]
    return make_batch(self.names, rate[:, None], valid[:, None], [1.0], captions, records, failed, evidence)


def _policy_rubrics(run_config) -> bool:
  return run_config.rubrics.source == "policy"


def drop_manifest_rubrics(run_config, records: list[ImageRecord]) -> list[ImageRecord]:
  """With rubrics.source='policy' the manifest's rubrics are not this run's: RL writes its own (`write_rubrics`)."""
  if not _policy_rubrics(run_config):
    return records
  return [dataclasses.replace(r, rubric=None) for r in records]


def write_rubrics(run: RLStart) -> tuple[list[ImageRecord], list[ImageRecord]]:
  """RubiCap stage 1 against the policy entering RL (rubrics.source='policy'): for every train and held-out
  image without a stored rubric, its greedy caption is checked against the committee consensus and each failure
  becomes a weighted criterion. Rubrics are saved under workdir/rubrics as they are made, so a resumed run
  reuses them; the records come back with their rubrics attached."""
  if not _policy_rubrics(run.config):
    return run.train_records, run.eval_records
  from jaxcap.multihost import first_process_then_others, is_lead_process

  store = RubricStore(run.workdir / "rubrics")
  todo = [r for r in run.train_records + run.eval_records if r.id not in store]
  if todo:
    bare = [r.id for r in todo if not r.teacher_captions]
    if bare:  # before captioning anything
      raise ValueError(
        f"rubrics.source='policy' needs teacher_captions (the committee) in every manifest row; "
        f"{len(bare)} rows have none, e.g. {bare[:3]}. Add them, or use rubrics.source='manifest' "
        "with rubrics from `python -m jaxcap.synthesize_rubrics`."
      )
    if run.step > 0 and is_lead_process():
      print(
        f"warning: {len(todo)} rubrics missing from {store.directory} at RL step {run.step}; writing them "
        "against the current policy, not the one RL started from",
        flush=True,
      )
    t0 = time.perf_counter()
    captions = run.captions(todo, run.config.rubrics.batch_size)
    jobs, _ = jobs_from_records(todo, {r.id: cap for r, cap in zip(todo, captions)})
    cfg = RubricSynthesisConfig(min_agreement=run.config.rubrics.min_agreement)
    outcomes = first_process_then_others(lambda: store.synthesize(run.judge, jobs, config=cfg), "jaxcap-rubrics") or []
    failed = [o for o in outcomes if o.rubric is None]
    if is_lead_process():
      print(
        f"rubrics: {len(jobs) - len(failed)} written against the policy's captions in "
        f"{time.perf_counter() - t0:.1f}s, {len(failed)} failed (their captions get no RubiCap reward)"
        + (f", e.g. {failed[0].image_id}: {failed[0].error}" if failed else ""),
        flush=True,
      )
  attach = lambda rs: [dataclasses.replace(r, rubric=store.load(r.id)) for r in rs]
  return attach(run.train_records), attach(run.eval_records)


@reward_family("rubicap", options=RubiCapConfig, prepare_records=drop_manifest_rubrics, before_rl=write_rubrics)
def rubicap_reward(judge: Judge, **options) -> RubiCapReward:
  return RubiCapReward(judge, RubiCapConfig(**options))
