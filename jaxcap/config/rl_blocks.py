"""The RL phase's sub-blocks: the policy loss, BalCapRL's length mask, the rollout correction and DAPO's overlong
penalty (the `Rl` block itself is in jaxcap.config.training)."""

from __future__ import annotations

import dataclasses

from jaxcap.fields import Block, field
from jaxcap.rl import KL_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSSES, PolicyLossConfig
from jaxcap.rl.rollout_correction import IS_LEVELS, REJECTIONS, RolloutCorrectionConfig

_LOSS, _CORRECTION = PolicyLossConfig, RolloutCorrectionConfig  # the runtime classes declare the defaults


@dataclasses.dataclass(frozen=True)
class Loss(Block):
  """The policy-gradient loss (jaxcap.rl.PolicyLossConfig): a surrogate from jaxcap.rl.POLICY_LOSSES, its
  hyper-parameters, the aggregation and the KL / entropy terms."""

  policy: str = field(_LOSS.policy, "the surrogate (ppo = clipped PPO; jaxcap.rl.policy_losses)", choices=POLICY_LOSSES)

  eps_low: float = field(_LOSS.eps_low, "the ratio is clipped below at 1 - eps_low", ge=0, lt=1)
  eps_high: float = field(_LOSS.eps_high, "the ratio is clipped above at 1 + eps_high (> eps_low: clip-higher)", ge=0)
  dual_clip_c: float | None = field(
    _LOSS.dual_clip_c,
    "cap of a negative advantage's token loss (None = off)",
    gt=1,
    hint="it caps a negative advantage's token loss at c x A",
  )
  aggregation: str = field(_LOSS.aggregation, "how token losses become one scalar", choices=LOSS_AGGREGATIONS)
  # KL to the SFT policy (k3, as CapRL's paper): without it, an earlier student (no vision warm-up) learned to pad
  # captions with broken text that the answerer mines for facts (held-out QA 9.1% -> 24.7%, captions degenerated);
  # with it QA rose 9.1% -> 25.9% at 28 tokens.
  kl_coef: float = field(
    _LOSS.kl_coef, "weight of the per-token KL to the reference (SFT) policy", ge=0, hint="0 = no KL term"
  )
  kl_estimator: str = field(_LOSS.kl_estimator, "the KL estimator", choices=KL_ESTIMATORS)
  entropy_coef: float = field(_LOSS.entropy_coef, "weight of an entropy bonus")
  tau_pos: float = field(_LOSS.tau_pos, "SAPO's gate temperature for positive advantages", gt=0)
  tau_neg: float = field(_LOSS.tau_neg, "SAPO's gate temperature for non-positive advantages", gt=0)
  clip_cov_ratio: float = field(_LOSS.clip_cov_ratio, "Clip-Cov: the share of tokens whose gradient is cut", gt=0, le=1)
  clip_cov_lb: float = field(_LOSS.clip_cov_lb, "Clip-Cov: the covariance band's lower end")
  clip_cov_ub: float = field(_LOSS.clip_cov_ub, "Clip-Cov: the covariance band's upper end")
  kl_cov_ratio: float = field(
    _LOSS.kl_cov_ratio, "KL-Cov: the share of tokens given the |log-ratio| penalty", gt=0, le=1
  )
  kl_cov_coef: float = field(_LOSS.kl_cov_coef, "KL-Cov: the penalty's weight", ge=0)

  def check(self, run, at):
    if not self.clip_cov_lb < self.clip_cov_ub:
      yield f"{at}clip_cov_lb={self.clip_cov_lb}, clip_cov_ub={self.clip_cov_ub}: need clip_cov_lb < clip_cov_ub"


@dataclasses.dataclass(frozen=True)
class LengthMask(Block):
  """BalCapRL's length-conditional mask: the named reward dimensions count only for captions whose word count is
  within [tau_low, tau_high] x the reference's."""

  dims: list[str] = field([], "reward dimensions masked outside the band ([] = no mask)")
  tau_low: float = field(0.5, "the band's lower end, as a share of the reference's words")
  tau_high: float = field(2.0, "the band's upper end, as a share of the reference's words")

  def check(self, run, at):
    if self.dims and not 0 <= self.tau_low < self.tau_high:
      yield f"{at}tau_low={self.tau_low}, tau_high={self.tau_high}: need 0 <= tau_low < tau_high"


@dataclasses.dataclass(frozen=True)
class RolloutCorrection(Block):
  """Importance weights / rejection between the sampler's log-probs and the old log-probs
  (jaxcap.rl.rollout_correction, verl's rollout_corr_helper); the mismatch metrics are logged every step anyway."""

  is_level: str = field(
    _CORRECTION.is_level, "truncated importance weights per token or per sequence", choices=IS_LEVELS
  )
  is_threshold: float = field(_CORRECTION.is_threshold, "the importance weights are truncated above at this", gt=0)
  reject: str = field(
    _CORRECTION.reject,
    "mask tokens / sequences whose divergence leaves the band (verl's rollout_rs)",
    choices=REJECTIONS,
  )
  reject_upper: float = field(_CORRECTION.reject_upper, "the band's upper end (k1: a ratio bound)", gt=0)
  reject_lower: float | None = field(_CORRECTION.reject_lower, "k1's lower ratio bound (None = 1 / reject_upper)", gt=0)


@dataclasses.dataclass(frozen=True)
class Overlong(Block):
  """DAPO's soft overlong punishment (jaxcap.rewards.overlong): a reward dimension `overlong`, 0 up to
  sampling.max_new_tokens - buffer tokens, then falling linearly to -penalty at max_new_tokens."""

  buffer: int = field(0, "the last this many tokens before sampling.max_new_tokens are penalised", ge=0, hint="0 = off")
  penalty: float = field(1.0, "the penalty at max_new_tokens, in reward units", ge=0)

  def check(self, run, at):
    if self.buffer > run.sampling.max_new_tokens:
      yield f"{at}buffer={self.buffer}: must not exceed sampling.max_new_tokens={run.sampling.max_new_tokens}"


def partial_rollout_problems(rl, run, at):
  """What rl.partial_rollouts needs of the run (jaxcap.train.rollouts.partial)."""
  if not rl.partial_rollouts:
    return
  if rl.max_staleness < 2:
    yield (
      f"{at}partial_rollouts=True needs {at}max_staleness >= 2 (a round's samples run on under the next weights, "
      f"one update newer); now {rl.max_staleness}"
    )
  if run.rollout.engine != "paged":
    yield f"{at}partial_rollouts=True needs rollout.engine=paged (the static sampler has no samples in flight)"
