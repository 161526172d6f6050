"""Critic-free advantages: GRPO group normalisation, Dr. GRPO, RLOO, process supervision.

Each outcome estimator is registered in ADVANTAGE_ESTIMATORS under the name grpo.adv_estimator takes.

Groups are contiguous: rows [k*G:(k+1)*G] answer prompt k (TokenVectorEnv's layout).
"""

from __future__ import annotations

import torch

from algos.core.variants import Registry

ADVANTAGE_ESTIMATORS = Registry("advantage estimator")  # (scores [B], group_size, eps) -> [B] advantages


def _grouped(values: torch.Tensor, group_size: int) -> torch.Tensor:
    if group_size < 1 or values.shape[0] % group_size:
        raise ValueError(f"batch of {values.shape[0]} rows is not a whole number of groups of {group_size}")
    return values.reshape(-1, group_size, *values.shape[1:])


def _centred(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """[B] scores -> [B] R - mean of the row's group."""
    grouped = _grouped(scores.float(), group_size)
    return (grouped - grouped.mean(dim=1, keepdim=True)).reshape(-1)


def group_advantages(scores: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """[B] scores -> [B] (R - group mean) / (group std + eps) (DeepSeekMath's GRPO).

    std is the unbiased sample std (as TRL's GRPOTrainer), so a group needs G >= 2.
    """
    if group_size < 2:
        raise ValueError("the grpo advantage needs group_size >= 2 (the std of one sample is undefined)")
    grouped = _grouped(scores.float(), group_size)
    std = grouped.std(dim=1, keepdim=True).expand_as(grouped).reshape(-1)
    return _centred(scores, group_size) / (std + eps)


ADVANTAGE_ESTIMATORS.register("grpo", group_advantages)


def batch_std_advantages(scores: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """[B] scores -> [B] (R - group mean) / (std of the whole batch + eps)."""
    return _centred(scores, group_size) / (scores.float().std() + eps)


ADVANTAGE_ESTIMATORS.register("batch-std", batch_std_advantages)


def mean_only_advantages(scores: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """[B] scores -> [B] R - group mean (Dr. GRPO, arXiv 2503.20783: no std division, so ``eps`` is unused)."""
    return _centred(scores, group_size)


ADVANTAGE_ESTIMATORS.register("dr-grpo", mean_only_advantages)


def leave_one_out_advantages(scores: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """[B] scores -> [B] R - mean of the other G - 1 scores of the group = G / (G - 1) * (R - group mean)
    (RLOO, Ahmadian et al. 2024, arXiv 2402.14740; no std division, so ``eps`` is unused)."""
    if group_size < 2:
        raise ValueError("the rloo advantage needs group_size >= 2 (a row's baseline is the others' mean)")
    return _centred(scores, group_size) * (group_size / (group_size - 1))


ADVANTAGE_ESTIMATORS.register("rloo", leave_one_out_advantages)


def zero_std_group_fraction(scores: torch.Tensor, group_size: int) -> float:
    """[B] scores -> fraction of groups whose scores are all equal (no learning signal)."""
    grouped = _grouped(scores.float(), group_size)
    return (grouped.amax(dim=1) == grouped.amin(dim=1)).float().mean().item()


def step_rewards_vary(step_rewards: torch.Tensor, step_mask: torch.Tensor, group_size: int) -> torch.Tensor:
    """[B, T] step rewards, [B, T] step mask -> [B // G] bool: do a group's step rewards differ (process signal)?"""
    mask = _grouped(step_mask.bool(), group_size)
    rewards = _grouped(step_rewards.float(), group_size)
    highest = torch.where(mask, rewards, -torch.inf).amax(dim=(1, 2))
    lowest = torch.where(mask, rewards, torch.inf).amin(dim=(1, 2))
    return highest > lowest


def process_advantages(
    step_rewards: torch.Tensor, step_mask: torch.Tensor, group_size: int, eps: float = 1e-6
) -> torch.Tensor:
    """[B, T] rewards at step-ending tokens, [B, T] step mask -> [B, T] sum of normalised step rewards ending at >= t.

    Step rewards are normalised over all steps of all completions in a group
    (DeepSeekMath process supervision). Tokens after the last step get 0.
    """
    if step_rewards.shape != step_mask.shape:
        raise ValueError(f"step_rewards {tuple(step_rewards.shape)} and step_mask {tuple(step_mask.shape)} differ")
    mask = _grouped(step_mask.float(), group_size)
    rewards = _grouped(step_rewards.float(), group_size) * mask
    count = mask.sum(dim=(1, 2), keepdim=True)
    mean = rewards.sum(dim=(1, 2), keepdim=True) / count.clamp(min=1)
    var = (((rewards - mean) * mask) ** 2).sum(dim=(1, 2), keepdim=True) / (count - 1).clamp(min=1)
    normalised = ((rewards - mean) / (var.sqrt() + eps) * mask).reshape(step_rewards.shape)
    # A_t = sum over steps ending at or after t: a reverse cumulative sum along T.
    return normalised.flip(-1).cumsum(-1).flip(-1)
