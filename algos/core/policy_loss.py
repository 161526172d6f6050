"""Policy losses: the clipped surrogate (PPO/GRPO/DAPO) with asymmetric clipping, dual clip and GSPO's sequence
ratio; CISPO's clipped importance weight; GMPO's geometric mean of clipped token ratios."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from algos.core.aggregation import masked_mean
from algos.core.variants import Registry

POLICY_LOSSES = Registry("policy loss")  # (logp, old_logp, advantages, mask, eps_low, eps_high, dual_clip) -> PolicyLossOutput


@dataclass
class PolicyLossOutput:
    """per_token_loss: [B, T] (aggregate it with algos.core.aggregation); stats: detached scalars."""

    per_token_loss: torch.Tensor
    stats: dict[str, float]


def sequence_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] log pi, [B, T] log pi_old, [B, T] mask -> [B, T] GSPO log-ratio: each row's mean token log-ratio, broadcast."""
    log_ratio = (logp - old_logp) * mask
    per_sequence = log_ratio.sum(-1) / mask.sum(-1).clamp(min=1)
    return per_sequence.unsqueeze(-1).expand_as(logp)


def clipped_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: float | None = None,
) -> PolicyLossOutput:
    """[B, T] log pi, [B, T] log pi_old, [B] or [B, T] advantages, [B, T] mask -> [B, T] loss -min(rA, clip(r)A) + stats,
    with the token ratio r = pi / pi_old (PPO, GRPO, DAPO).

    dual_clip = c (> 1) bounds the loss of negative-advantage tokens at -c*A (Ye et al. 2020).
    Stats over valid tokens: clip_frac_low / clip_frac_high (clipping active, gradient zeroed, on
    each side), dual_clip_frac, ratio_min / ratio_mean / ratio_max.
    """
    return clipped_surrogate(logp - old_logp, advantages, mask, eps_low, eps_high, dual_clip)


POLICY_LOSSES.register("ppo-clip", clipped_policy_loss)


def gspo_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: float | None = None,
) -> PolicyLossOutput:
    """As clipped_policy_loss, with GSPO's ratio (arXiv 2507.18071): each row's geometric-mean token ratio,
    for every token of the row."""
    log_ratio = sequence_log_ratio(logp, old_logp, mask.to(logp.dtype))
    return clipped_surrogate(log_ratio, advantages, mask, eps_low, eps_high, dual_clip)


POLICY_LOSSES.register("gspo", gspo_policy_loss)


def cispo_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float = 1.0,
    eps_high: float = 0.28,
    dual_clip: float | None = None,
) -> PolicyLossOutput:
    """[B, T] log pi, [B, T] log pi_old, [B] or [B, T] advantages, [B, T] mask -> [B, T] loss
    -sg(clip(r, 1 - eps_low, 1 + eps_high)) * A * log pi (CISPO, MiniMax-M1, arXiv 2506.13585): the importance weight
    is clipped and detached, so every token keeps its gradient, where the clipped surrogate zeroes the clipped ones.
    eps_low = 1 leaves the weight no lower bound, as the paper. ``dual_clip`` does not apply. Stats: the share of
    weights clipped below / above, the ratio's range."""
    mask = mask.to(logp.dtype)
    log_ratio = (logp - old_logp).detach()
    ratio = torch.exp(log_ratio.clamp(max=20.0))
    weight = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    advantages = _per_token(advantages, logp)
    loss = -weight * advantages * logp
    return PolicyLossOutput(per_token_loss=loss * mask,
                            stats=_ratio_stats(ratio, ratio < 1.0 - eps_low, ratio > 1.0 + eps_high, mask))


POLICY_LOSSES.register("cispo", cispo_policy_loss)


def gmpo_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float = 0.4,
    eps_high: float = 0.4,
    dual_clip: float | None = None,
) -> PolicyLossOutput:
    """[B, T] log pi, [B, T] log pi_old, [B] advantages, [B, T] mask -> [B, T] loss -A_i * exp(mean_t clipped log r_t)
    on each of row i's tokens (GMPO, arXiv 2507.20673: the geometric mean of the token ratios, each clipped as PPO
    clips it for the sign of A, in log space: log r within [-eps_low, eps_high], the paper's (e^-0.4, e^0.4)).
    With seq-mean-token-mean aggregation the loss is the mean over rows of -A_i * ratio_i. ``dual_clip`` does not
    apply. Stats as the clipped surrogate's, over the token ratios."""
    mask = mask.to(logp.dtype)
    if advantages.dim() != 1:
        raise ValueError("gmpo takes one advantage per row ([B]): its ratio is a row's geometric mean")
    log_ratio = logp - old_logp
    sign = torch.sign(advantages).to(logp.dtype).unsqueeze(-1)
    # PPO's min(r A, clip(r) A), taken in log space: the bound that binds depends on the sign of A.
    clipped = sign * torch.minimum(sign * log_ratio, sign * log_ratio.clamp(-eps_low, eps_high))
    sequence_ratio = torch.exp((clipped * mask).sum(-1) / mask.sum(-1).clamp(min=1))
    loss = (-advantages.to(logp.dtype) * sequence_ratio).unsqueeze(-1).expand_as(logp)
    ratio = torch.exp(log_ratio.detach().clamp(max=20.0))
    positive, negative = advantages.unsqueeze(-1) > 0, advantages.unsqueeze(-1) < 0
    stats = _ratio_stats(ratio, (log_ratio < -eps_low) & negative, (log_ratio > eps_high) & positive, mask)
    return PolicyLossOutput(per_token_loss=loss * mask, stats=stats)


POLICY_LOSSES.register("gmpo", gmpo_policy_loss)


def _per_token(advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """[B] or [B, T] advantages -> [B, T] as ``like``'s dtype and shape."""
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    return advantages.to(like.dtype).expand_as(like)


@torch.no_grad()
def _ratio_stats(ratio: torch.Tensor, clipped_low: torch.Tensor, clipped_high: torch.Tensor, mask: torch.Tensor) -> dict:
    """The policy-loss statistics over valid tokens: clip fractions per side (no dual clip), the ratio's range."""
    valid_ratios = ratio[mask > 0]
    return {
        "clip_frac_low": masked_mean(clipped_low.to(mask.dtype), mask).item(),
        "clip_frac_high": masked_mean(clipped_high.to(mask.dtype), mask).item(),
        "dual_clip_frac": 0.0,
        "ratio_min": valid_ratios.min().item() if valid_ratios.numel() else 1.0,
        "ratio_mean": valid_ratios.mean().item() if valid_ratios.numel() else 1.0,
        "ratio_max": valid_ratios.max().item() if valid_ratios.numel() else 1.0,
    }


def clipped_surrogate(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None,
) -> PolicyLossOutput:
    """[B, T] log-ratio, [B] or [B, T] advantages, [B, T] mask -> the clipped surrogate's [B, T] loss and stats."""
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (or None), got {dual_clip}")
    mask = mask.to(log_ratio.dtype)
    advantages = _per_token(advantages, log_ratio)
    ratio = torch.exp(log_ratio.clamp(max=20.0))  # exp(20) ~ 5e8: finite, and such tokens are clipped anyway
    clipped_ratio = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss = torch.maximum(-advantages * ratio, -advantages * clipped_ratio)
    dual_clipped = torch.zeros_like(mask, dtype=torch.bool)
    if dual_clip is not None:
        bound = -advantages * dual_clip
        dual_clipped = (advantages < 0) & (loss > bound)
        loss = torch.where(advantages < 0, torch.minimum(loss, bound), loss)

    ratio = ratio.detach()
    stats = _ratio_stats(ratio, (ratio < 1.0 - eps_low) & (advantages < 0), (ratio > 1.0 + eps_high) & (advantages > 0), mask)
    stats["dual_clip_frac"] = masked_mean(dual_clipped.to(mask.dtype), mask).item()
    return PolicyLossOutput(per_token_loss=loss * mask, stats=stats)
