"""verl's policy losses, rollout correction and estimators transcribed to torch (CPU) from verl 0.9's
`verl/trainer/ppo/core_algos.py`, `verl/trainer/ppo/rollout_corr_helper.py` and `verl/utils/torch_functional.py`
(volcengine/verl main at b178a3cd5, the 0.9 line), formulas as written there; verl itself does not install on CPU
without CUDA torch. Config objects are replaced by keyword arguments; `global_batch_info` is empty (verl's legacy
worker path, local token / sequence counts); `.item()` metrics stay tensors. Only what the tests compare is kept.
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch


def masked_sum(values, mask, axis=None):
  valid_values = torch.where(mask.bool(), values, 0.0)
  return (valid_values * mask).sum(axis=axis) if axis is not None else (valid_values * mask).sum()


def masked_mean(values, mask, axis=None):
  s = masked_sum(values, mask, axis)
  return s / ((mask.sum(axis=axis) if axis is not None else mask.sum()) + 1e-8)


def masked_var(values, mask, unbiased=True):
  mean = masked_mean(values, mask)
  centered_values = values - mean
  variance = masked_mean(centered_values**2, mask)
  if unbiased:
    mask_sum = mask.sum()
    variance = variance * (mask_sum / (mask_sum - 1))
  return variance


def masked_whiten(values, mask):
  mean, var = masked_mean(values, mask), masked_var(values, mask)
  return (values - mean) * torch.rsqrt(var + 1e-8)


def agg_loss(loss_mat, loss_mask, loss_agg_mode):
  if loss_agg_mode == "token-mean":
    return masked_sum(loss_mat, loss_mask) / loss_mask.sum()
  if loss_agg_mode == "seq-mean-token-sum":
    seq_losses = torch.sum(loss_mat * loss_mask, dim=-1)
    seq_mask = (torch.sum(loss_mask, dim=-1) > 0).float()
    return masked_sum(seq_losses, seq_mask) / seq_mask.sum()
  if loss_agg_mode == "seq-mean-token-mean":
    seq_mask = torch.sum(loss_mask, dim=-1)
    seq_losses = torch.sum(loss_mat * loss_mask, dim=-1) / (seq_mask + 1e-8)
    seq_mask = (seq_mask > 0).float()
    return masked_sum(seq_losses, seq_mask) / seq_mask.sum()
  if loss_agg_mode == "seq-mean-token-sum-norm":
    return torch.sum(torch.sum(loss_mat * loss_mask, dim=-1)) / loss_mask.shape[-1]
  raise ValueError(loss_agg_mode)


def vanilla(old_log_prob, log_prob, advantages, response_mask, mode, *, eps_low, eps_high, clip_ratio_c=3.0, w=None):
  negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
  ratio = torch.exp(negative_approx_kl)
  pg_losses1 = -advantages * ratio
  pg_losses2 = -advantages * torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
  clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
  pg_clipfrac = masked_mean(torch.gt(pg_losses2, pg_losses1).float(), response_mask)
  pg_losses3 = -advantages * clip_ratio_c
  clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
  pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
  if w is not None:
    pg_losses = pg_losses * w
  return agg_loss(pg_losses, response_mask, mode), {"clip_frac": pg_clipfrac}


def gspo(old_log_prob, log_prob, advantages, response_mask, mode, *, eps_low, eps_high, w=None):
  negative_approx_kl = log_prob - old_log_prob
  seq_lengths = torch.sum(response_mask, dim=-1).clamp(min=1)
  negative_approx_kl_seq = torch.sum(negative_approx_kl * response_mask, dim=-1) / seq_lengths
  log_seq_importance_ratio = log_prob - log_prob.detach() + negative_approx_kl_seq.detach().unsqueeze(-1)
  log_seq_importance_ratio = torch.clamp(log_seq_importance_ratio, max=10.0)
  seq_importance_ratio = torch.exp(log_seq_importance_ratio)
  pg_losses1 = -advantages * seq_importance_ratio
  pg_losses2 = -advantages * torch.clamp(seq_importance_ratio, 1 - eps_low, 1 + eps_high)
  pg_losses = torch.maximum(pg_losses1, pg_losses2)
  if w is not None:
    pg_losses = pg_losses * w
  pg_loss = agg_loss(pg_losses, response_mask, "seq-mean-token-mean")
  return pg_loss, {"clip_frac": masked_mean(torch.gt(pg_losses2, pg_losses1).float(), response_mask)}


def sapo(old_log_prob, log_prob, advantages, response_mask, mode, *, tau_pos, tau_neg, w=None):
  tau_pos = torch.as_tensor(tau_pos, dtype=advantages.dtype)
  tau_neg = torch.as_tensor(tau_neg, dtype=advantages.dtype)
  ratio = torch.exp(torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0))
  taus = torch.where(advantages > 0, tau_pos, tau_neg)
  gates = torch.sigmoid(taus * (ratio - 1.0)) * (4.0 / taus)
  pg_losses = -gates * advantages
  if w is not None:
    pg_losses = pg_losses * w
  return agg_loss(pg_losses, response_mask, "seq-mean-token-mean"), {}


def gpg(old_log_prob, log_prob, advantages, response_mask, mode, *, w=None):
  pg_losses = -log_prob * advantages
  if w is not None:
    pg_losses = pg_losses * w
  return agg_loss(pg_losses, response_mask, mode), {}


def clip_cov(old_log_prob, log_prob, advantages, response_mask, mode, *, eps_low, eps_high, ratio_, lb, ub, w=None):
  ratio = torch.exp(log_prob - old_log_prob)
  pg_losses1 = -advantages * ratio
  corr = torch.ones_like(advantages)
  pg_losses2 = -advantages * torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
  clip_by_origin = (pg_losses2 > pg_losses1) & (response_mask > 0)
  cov_all = (advantages - masked_mean(advantages, response_mask)) * (
    log_prob - masked_mean(log_prob.detach(), response_mask)
  )
  cov_all[response_mask == 0] = -torch.inf
  cov_all[clip_by_origin] = -torch.inf
  clip_num = max(int(ratio_ * response_mask.sum().item()), 1)
  top_k_idx = (cov_all < ub) & (cov_all > lb) & (response_mask > 0)
  top_k_idx = torch.nonzero(top_k_idx)
  if len(top_k_idx) > 0:
    perm = torch.randperm(len(top_k_idx))
    top_k_idx = top_k_idx[perm[: min(clip_num, len(top_k_idx))]]
  else:
    top_k_idx = torch.empty((0, 2), dtype=torch.long)
  corr[top_k_idx[:, 0], top_k_idx[:, 1]] = 0
  pg_clipfrac = masked_mean((corr == 0).float(), response_mask)
  pg_losses = torch.maximum(pg_losses1, pg_losses2) * corr
  if w is not None:
    pg_losses = pg_losses * w
  return agg_loss(pg_losses, response_mask, mode), {"clip_frac": pg_clipfrac}


def kl_cov(old_log_prob, log_prob, advantages, response_mask, mode, *, kl_cov_ratio, ppo_kl_coef, w=None):
  negative_approx_kl = log_prob - old_log_prob
  abs_kl = negative_approx_kl.abs()
  ratio = torch.exp(negative_approx_kl)
  pg_losses1 = -advantages * ratio
  pg_losses_kl = -advantages * ratio + ppo_kl_coef * abs_kl
  pg_losses = pg_losses1.clone()  # verl aliases; the clone keeps autograd happy with the in-place write
  all_valid = response_mask > 0
  all_valid_idx = torch.nonzero(all_valid.reshape(-1), as_tuple=True)[0]
  all_valid_adv = advantages[all_valid].detach().reshape(-1).cpu()
  all_valid_logp = log_prob[all_valid].detach().reshape(-1).cpu()
  k = min(kl_cov_ratio, len(all_valid_adv))
  if k != 0:
    cov_lst_all = (all_valid_adv - all_valid_adv.mean()) * (all_valid_logp - all_valid_logp.mean())
    k_percent_nums = max(1, int(len(cov_lst_all) * kl_cov_ratio))
    large_cov_idxs = torch.topk(cov_lst_all, k_percent_nums, largest=True).indices
    if len(large_cov_idxs) != 0:
      large_cov_idxs = all_valid_idx[large_cov_idxs]
      t = advantages.shape[1]
      pg_losses[large_cov_idxs // t, large_cov_idxs % t] = pg_losses_kl[large_cov_idxs // t, large_cov_idxs % t]
  if w is not None:
    pg_losses = pg_losses * w
  return agg_loss(pg_losses, response_mask, mode), {"kl_cov_abs_kl": masked_mean(abs_kl, response_mask)}


def geo_mean(old_log_prob, log_prob, advantages, response_mask, mode, *, eps_low, eps_high, w=None):
  negative_approx_kl = log_prob - old_log_prob
  sgn_advantage = torch.sign(advantages)
  negative_approx_kl_clamp = torch.clamp(negative_approx_kl, -eps_low, eps_high)
  negative_approx_kl_min = torch.min(sgn_advantage * negative_approx_kl, sgn_advantage * negative_approx_kl_clamp)
  negative_approx_kl_min = sgn_advantage * negative_approx_kl_min
  response_mask_sum = response_mask.sum(dim=-1)
  ratio = torch.exp((negative_approx_kl_min * response_mask).sum(dim=-1) / (response_mask_sum + 1e-8))
  advantage = (advantages * response_mask).sum(dim=-1) / (response_mask_sum + 1e-8)
  pg_losses = -advantage * ratio
  if w is not None:
    seq_is_weights = torch.exp((torch.log(w + 1e-10) * response_mask).sum(dim=-1) / (response_mask_sum + 1e-8))
    pg_losses = pg_losses * seq_is_weights
  pg_loss = torch.mean(pg_losses)
  clipped = torch.ne(negative_approx_kl, negative_approx_kl_clamp)
  return pg_loss, {
    "clip_frac": masked_mean((clipped * (advantages > 0)).float(), response_mask),
    "clip_frac_low": masked_mean((clipped * (advantages < 0)).float(), response_mask),
  }


def cispo(old_log_prob, log_prob, advantages, response_mask, mode, *, eps_low, eps_high, w=None):
  ratio = torch.exp(torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0))
  clipped_ratio = torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
  pg_losses = -clipped_ratio.detach() * advantages * log_prob
  pg_clipfrac = masked_mean((ratio != clipped_ratio).float(), response_mask)
  if w is not None:
    pg_losses = pg_losses * w
  return agg_loss(pg_losses, response_mask, mode), {"clip_frac": pg_clipfrac}


# -- rollout_corr_helper.py ------------------------------------------------------------------------------------

SAFETY_BOUND = 20.0


def rollout_is_weights(log_ratio, response_mask, rollout_is, threshold):
  """compute_rollout_correction_weights (no batch normalisation) and the compute_is_metrics this module reports."""
  if rollout_is == "token":
    log_ratio_for_metrics = log_ratio
    w = torch.exp(torch.clamp(log_ratio, min=-SAFETY_BOUND, max=SAFETY_BOUND))
  else:
    log_ratio_sum = masked_sum(log_ratio, response_mask, axis=-1).unsqueeze(-1)
    log_ratio_for_metrics = log_ratio_sum
    w = torch.exp(torch.clamp(log_ratio_sum, min=-SAFETY_BOUND, max=SAFETY_BOUND)).expand_as(log_ratio)
  w = w * response_mask
  metrics = {}
  if rollout_is == "sequence":
    log_max = log_ratio_for_metrics.max()
    metrics["is_max"] = torch.exp(torch.clamp(log_max, max=SAFETY_BOUND))
    metrics["is_mean"] = masked_mean(w, response_mask)
    exceeds_upper = log_ratio_for_metrics > torch.log(torch.tensor(threshold))
    metrics["is_truncated_frac"] = exceeds_upper.float().mean()
  else:
    metrics["is_mean"] = masked_mean(w, response_mask)
    metrics["is_truncated_frac"] = masked_mean((w > threshold).float(), response_mask)
    metrics["is_max"] = w.masked_fill(~response_mask.bool(), float("-inf")).max()
  return w.clamp(max=threshold).detach(), metrics


def rollout_rejection(log_ratio, response_mask, option, spec):
  """compute_rollout_rejection_mask for one option; spec as verl's rollout_rs_threshold string."""
  if option.endswith("k1"):
    if "_" in spec:
      lower, upper = (float(v) for v in spec.split("_", 1))
    else:
      upper = float(spec)
      lower = float(str(1.0 / upper))
    lower_log, upper_log = math.log(lower), math.log(upper)
  else:
    upper = float(spec)
  lrs = torch.clamp(log_ratio, min=-SAFETY_BOUND, max=SAFETY_BOUND)
  tok = {"k1": -lrs, "k2": 0.5 * lrs**2, "k3": torch.exp(lrs) - 1.0 - lrs}[option[-2:]]

  def seq_max(values):
    neg_inf = torch.tensor(float("-inf"), dtype=values.dtype)
    mv = values.masked_fill(~response_mask.bool(), neg_inf).max(dim=-1).values
    return torch.where(mv == neg_inf, torch.zeros_like(mv), mv)

  if option.startswith("token"):
    stat = tok
  elif option.startswith("seq_sum"):
    stat = masked_sum(tok, response_mask, axis=-1).unsqueeze(-1)
  elif option.startswith("seq_mean"):
    stat = masked_mean(tok, response_mask, axis=-1).unsqueeze(-1)
  else:
    stat = seq_max(tok).unsqueeze(-1)
  keep = (stat >= lower_log) & (stat <= upper_log) if option.endswith("k1") else stat <= upper
  keep = keep.expand_as(response_mask)
  final_mask = keep.to(log_ratio.dtype)
  mask_bool = response_mask.bool()
  metrics = {
    "reject_token_frac": masked_mean(1 - final_mask, response_mask),
    "reject_seq_frac": (~((final_mask > 0.5) & mask_bool) & mask_bool).any(dim=-1).float().mean(),
  }
  return response_mask * final_mask, metrics


def offpolicy_metrics(old_log_prob, rollout_log_prob, response_mask):
  """compute_offpolicy_metrics, the keys this module reports (renamed: kl -> kl_k1, k3_kl -> kl_k3)."""
  m = {}
  mean_old = masked_mean(old_log_prob, response_mask, axis=-1)
  m["training_log_ppl"] = (-mean_old).mean()
  m["kl_k1"] = masked_mean(rollout_log_prob - old_log_prob, response_mask)
  log_ratio = old_log_prob - rollout_log_prob
  m["kl_k3"] = masked_mean(torch.exp(log_ratio) - log_ratio - 1, response_mask)
  mean_roll = masked_mean(rollout_log_prob, response_mask, axis=-1)
  m["rollout_log_ppl"] = (-mean_roll).mean()
  diff = mean_roll - mean_old
  m["log_ppl_diff"] = diff.mean()
  m["log_ppl_abs_diff"] = diff.abs().mean()
  rho = torch.exp(torch.clamp(log_ratio, min=-SAFETY_BOUND, max=SAFETY_BOUND))
  m["chi2_token"] = masked_mean(rho.square(), response_mask) - 1.0
  return m


# -- advantage estimators (outcome rewards: token_level_rewards summed per sequence) ---------------------------


def _groups(index):
  groups = defaultdict(list)
  for i, g in enumerate(index):
    groups[g].append(i)
  return groups


def _scores(token_level_rewards):
  return token_level_rewards.sum(dim=-1)


def reinforce_pp(token_level_rewards, response_mask, gamma=1.0):
  returns = torch.zeros_like(token_level_rewards)
  running_return = 0
  for t in reversed(range(token_level_rewards.shape[1])):
    running_return = token_level_rewards[:, t] + gamma * running_return
    returns[:, t] = running_return
    running_return = running_return * response_mask[:, t]
  return masked_whiten(returns, response_mask) * response_mask


def reinforce_pp_baseline(token_level_rewards, response_mask, index):
  response_length = token_level_rewards.shape[-1]
  scores = _scores(token_level_rewards)
  for idx, rows in _groups(index).items():
    mean = torch.tensor(0.0) if len(rows) == 1 else torch.mean(scores[rows])
    scores[rows] = scores[rows] - mean
  scores = scores.unsqueeze(-1).tile([1, response_length]) * response_mask
  return masked_whiten(scores, response_mask) * response_mask


def gpg_advantage(token_level_rewards, response_mask, index, f_norm=1.0):
  scores = _scores(token_level_rewards)
  bsz = scores.shape[0]
  alpha = bsz / torch.count_nonzero(scores).clamp(min=1)
  out = scores.clone()
  for idx, rows in _groups(index).items():
    mean = torch.tensor(0.0) if len(rows) == 1 else torch.mean(scores[rows])
    out[rows] = alpha * (scores[rows] - mean) / f_norm
  return out.unsqueeze(-1) * response_mask


def opo(token_level_rewards, response_mask, index):
  response_length = response_mask.sum(dim=-1)
  scores = _scores(token_level_rewards)
  out = scores.clone()
  for idx, rows in _groups(index).items():
    if len(rows) == 1:
      bsl = torch.tensor(0.0)
    else:
      bsl = (response_length[rows] * scores[rows]).sum() / response_length[rows].sum()
    out[rows] = scores[rows] - bsl
  return out.unsqueeze(-1) * response_mask


def grpo_passk(token_level_rewards, response_mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=True):
  scores = _scores(token_level_rewards)
  advantages = torch.zeros_like(scores)
  for idx, rows in _groups(index).items():
    rewards = scores[rows]
    topk, topk_idx = torch.topk(rewards, 2)
    advantage = topk[0] - topk[1]
    if norm_adv_by_std_in_grpo:
      advantage = advantage / (torch.std(rewards) + epsilon)
    advantages[rows[topk_idx[0].item()]] = advantage
  return advantages.unsqueeze(-1) * response_mask
