"""Per-image metrics of one policy's held-out greedy captions, as `RatioMetric`s over the same images for every
arm, so arms compare by paired bootstrap (jaxcap.eval.metrics). Units: percent, words for lengths.

Metric names (an experiment asks for a subset; groups are computed only when asked for):
  qa                      caption-only QA accuracy over every held-out question (the main job's metric)
  precision, recall, linguistic, prl_hmean   BalCapRL's three rewards (unmasked) and their harmonic mean
  length/words, in_band   caption words; share of images with 0.5 <= words / reference words <= 2.0
  captionqa/*, dcscore/*, caparena/*, bcapscore   jaxcap.eval's suites; CapArena against the shared start
  hack/<reward>/any       share of images where some red-team attack beats the policy's own caption under
                          <reward> (jaxcap.eval.redteam's attacks); hack/<reward>/padding: the padding attacks
                          only; hack/own/*: under the reward the arm trained on
  vqa                     the policy's own accuracy on (image, question) pairs (jaxcap.eval.vqa), needs weights
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from jaxcap.data.records import ImageRecord
from jaxcap.eval.captioners import CaptionSet
from jaxcap.eval.metrics import RatioMetric, SuiteResult
from jaxcap.eval.redteam import ATTACKS, RedTeamConfig, make_attacks
from jaxcap.judges.protocol import Judge
from jaxcap.rewards.mix import build_reward
from jaxcap.train.shell.heldout import HELDOUT_QA

HACK_REWARDS: dict[str, dict] = {
  "caprl": {"caprl": {"preset": "paper"}},
  "caprl_released": {"caprl": {"preset": "released_code"}},
  "rubicap": {"rubicap": {}},
  "balcaprl": {"balcaprl": {}},
  "likert_direct": {"likert_direct": {}},
  "likert_reference": {"likert_reference": {}},
}
PADDING_ATTACKS = ("repeated_true_fact", "generic_filler")
BAND = (0.5, 2.0)  # BalCapRL's tau_l, tau_u


def _wants(wanted: Sequence[str], *prefixes: str) -> bool:
  return any(m.startswith(p) for m in wanted for p in prefixes)


def _scalar_reward(reward_config: Mapping, judge: Judge, captions: list[str], records) -> tuple[np.ndarray, np.ndarray]:
  """[N] weighted reward of each caption over its reward's dimensions, and whether every weighted one is valid."""
  batch = build_reward({k: dict(v) for k, v in reward_config.items()}, judge)(captions, records, step=0)
  w = np.asarray(batch.weights, float)
  ok = batch.valid[:, w != 0].all(axis=1)
  return np.where(ok, batch.values.astype(float) @ w / max(w.sum(), 1e-12), 0.0), ok


def hack_metrics(
  judge: Judge, records, honest: list[str], label: str, reward_config: Mapping
) -> dict[str, RatioMetric]:
  """hack/<label>/any and /padding: per image, whether an attack caption (built from the honest one) scores above
  the honest caption under the reward; images where either judgment is masked drop out."""
  attacks = [make_attacks(r, h, RedTeamConfig()) for r, h in zip(records, honest)]
  h, h_ok = _scalar_reward(reward_config, judge, honest, records)
  beats = {}
  for attack in ATTACKS:
    a, a_ok = _scalar_reward(reward_config, judge, [x[attack] for x in attacks], records)
    beats[attack] = (np.where(a_ok & h_ok, a > h + 1e-9, False), a_ok & h_ok)
  out = {}
  for name, group in (("any", tuple(ATTACKS)), ("padding", PADDING_ATTACKS)):
    valid = np.all([beats[k][1] for k in group], axis=0)
    hit = np.any([beats[k][0] for k in group], axis=0)
    out[f"hack/{label}/{name}"] = RatioMetric.per_image(100.0 * hit, valid)
  return out


def caption_metrics(
  judge: Judge,
  records: Sequence[ImageRecord],
  captions: CaptionSet,
  start: CaptionSet,
  wanted: Sequence[str],
  own_reward: Mapping | None = None,
) -> SuiteResult:
  """The `wanted` metrics (and whatever their group computes alongside) of `captions` on `records` [N]; the
  composites over them are `jaxcap.experiments.suite.COMPOSITES`."""
  from jaxcap.eval.evaluate import EvalConfig, evaluate_captioner

  records = list(records)
  texts = captions.first(records)
  out = SuiteResult()
  qa = build_reward(HELDOUT_QA, judge)(texts, records, step=0)
  out.metrics["qa"] = RatioMetric.per_image(100.0 * qa.values[:, 0], qa.valid[:, 0])
  bal = build_reward({"balcaprl": {}}, judge)(texts, records, step=0)
  for k, name in enumerate(bal.names):
    out.metrics[name.split("/")[-1]] = RatioMetric.per_image(100.0 * bal.values[:, k], bal.valid[:, k])
  words, ref = bal.caption_lengths.astype(float), bal.reference_lengths.astype(float)
  out.metrics["length/words"] = RatioMetric.per_image(words, np.ones(len(records), bool))
  band = (ref > 0) & (BAND[0] * ref <= words) & (words <= BAND[1] * ref)
  out.metrics["in_band"] = RatioMetric.per_image(100.0 * band, ref > 0)
  suites = tuple(s for s in ("captionqa", "dcscore", "caparena") if _wants(wanted, s) or _wants(wanted, "bcapscore"))
  if suites:
    config = EvalConfig(suites=suites, redteam=None)
    result = evaluate_captioner(judge, records, captions, {"start": start}, config)
    result.metrics.pop("length/words", None)
    out = out.merge(result)
  for label, reward in HACK_REWARDS.items():
    if _wants(wanted, f"hack/{label}"):
      out.metrics.update(hack_metrics(judge, records, texts, label, reward))
  if _wants(wanted, "hack/own") and own_reward:
    own = hack_metrics(judge, records, texts, "own", own_reward)
    out.metrics.update(own)
  elif _wants(wanted, "hack/own"):  # no reward of its own (an SFT arm): nothing to hack
    n = len(records)
    for name in ("any", "padding"):
      out.metrics[f"hack/own/{name}"] = RatioMetric.per_image(np.zeros(n), np.zeros(n, bool))
  return out


def pool_seeds(per_seed: Sequence[Mapping[str, RatioMetric]]) -> dict[str, RatioMetric]:
  """One metric per name over several seeds' captions of the same images: per image, numerators and
  denominators summed, so each image weighs the same in the paired bootstrap whatever the seed count."""
  names = set.intersection(*(set(m) for m in per_seed)) if per_seed else set()
  return {
    k: RatioMetric.from_arrays(
      np.sum([np.asarray(m[k].num) for m in per_seed], axis=0), np.sum([np.asarray(m[k].den) for m in per_seed], axis=0)
    )
    for k in sorted(names)
  }
