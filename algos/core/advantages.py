"""Critic-free advantages: GRPO group normalisation, Dr. GRPO, process supervision.

Groups are contiguous: rows [k*G:(k+1)*G] answer prompt k (TokenVectorEnv's layout).
"""

from __future__ import annotations

import torch

SCALES = ("group", "batch", "none")


def _grouped(values: torch.Tensor, group_size: int) -> torch.Tensor:
    if group_size < 1 or values.shape[0] % group_size:
        raise ValueError(f"batch of {values.shape[0]} rows is not a whole number of groups of {group_size}")
    return values.reshape(-1, group_size, *values.shape[1:])


def group_advantages(scores: torch.Tensor, group_size: int, scale: str = "group", eps: float = 1e-6) -> torch.Tensor:
    """[B] scores -> [B] advantages (R - group mean) / (std + eps); std over the group, the batch, or none (Dr. GRPO).

    std is the unbiased sample std (as TRL's GRPOTrainer), so a group needs G >= 2.
    """
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    grouped = _grouped(scores.float(), group_size)
    centred = (grouped - grouped.mean(dim=1, keepdim=True)).reshape(-1)
    if scale == "none":
        return centred
    if group_size < 2 and scale == "group":
        raise ValueError("scale='group' needs group_size >= 2 (the std of one sample is undefined)")
    if scale == "group":
        std = grouped.std(dim=1, keepdim=True).expand_as(grouped).reshape(-1)
    else:
        std = scores.float().std()
    return centred / (std + eps)


def mean_only_advantages(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """[B] scores -> [B] advantages R - group mean (Dr. GRPO, arXiv 2503.20783)."""
    return group_advantages(scores, group_size, scale="none")


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
