"""Rollout/training mismatch: the sampler's log-probs (vLLM's kernels and precision, a top-p filter) differ from the
trainer's, so the samples come from a policy slightly other than the one the gradient assumes. Importance weights
pi_train / pi_rollout, truncated or masked, correct the policy gradient (TRL's vllm_importance_sampling_*, verl's
rollout_is). Each mode is registered in ROLLOUT_CORRECTIONS: (train log-probs [B, T], rollout log-probs [B, T],
mask [B, T], cap C) -> ([B, T] detached weights, counts of what it cut: tokens truncated or rows masked).
"""

from __future__ import annotations

import math

import torch

from algos.core.variants import Registry

ROLLOUT_CORRECTIONS = Registry("rollout correction")


def _log_ratio(train_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] log pi_train - log pi_rollout on valid tokens, 0 elsewhere, no gradient."""
    return ((train_logp.detach() - rollout_logp) * mask).nan_to_num(0.0)


def truncated_is_weights(train_logp, rollout_logp, mask, cap: float) -> tuple[torch.Tensor, dict[str, float]]:
    """[B, T] -> [B, T] min(pi_train / pi_rollout, C) per token (truncated importance sampling, Yao et al. 2025; TRL's
    token_truncate); counts: tokens truncated."""
    ratio = torch.exp(_log_ratio(train_logp, rollout_logp, mask).clamp(max=20.0))
    return ratio.clamp(max=cap) * mask, {"rollout_is_truncated": ((ratio > cap) & (mask > 0)).sum().item()}


ROLLOUT_CORRECTIONS.register("tis", truncated_is_weights)


def sequence_masked_is_weights(train_logp, rollout_logp, mask, cap: float) -> tuple[torch.Tensor, dict[str, float]]:
    """[B, T] -> [B, T] the sequence's pi_train / pi_rollout (product over its tokens) on each of its tokens, or 0 for a
    sequence whose ratio is above C or below 1 / C (masked sequence-level importance sampling; TRL's sequence_mask);
    counts: rows (with a valid token) masked."""
    sequence_log_ratio = _log_ratio(train_logp, rollout_logp, mask).sum(-1, keepdim=True)
    kept = sequence_log_ratio.abs() <= math.log(cap)
    weights = torch.where(kept, torch.exp(sequence_log_ratio.clamp(max=20.0)), 0.0).expand_as(mask)
    return weights * mask, {"rollout_is_masked": ((~kept.squeeze(-1)) & (mask > 0).any(-1)).sum().item()}


ROLLOUT_CORRECTIONS.register("seq_mask", sequence_masked_is_weights)


def mismatch_sums(train_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """[B, T] -> sums over valid tokens of |log pi_train - log pi_rollout| and of the k3 estimate of
    KL(pi_rollout || pi_train) on the rollout's samples (exp(d) - d - 1 >= 0 with d = log pi_train - log pi_rollout);
    divide by the token count for the means logged as rollout_logp_abs_diff and rollout_kl."""
    difference = _log_ratio(train_logp, rollout_logp, mask)
    k3 = (torch.exp(difference.clamp(max=20.0)) - difference - 1) * mask
    return {"rollout_logp_abs_diff": difference.abs().sum().item(), "rollout_kl": k3.sum().item()}
