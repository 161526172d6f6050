"""Correcting for the rollout/training mismatch, the same for every algorithm (GRPO per micro-batch, PPO per batch).

A rollout engine with its own copy of the weights (vLLM) samples from a policy slightly off the trainer's: its
per-token log-probs differ. loss.rollout_correction weighs each token's policy loss by pi_old / pi_rollout (the
registered methods of algos/core/importance_weights.py) and, whatever the method, the mismatch is measured."""

from __future__ import annotations

import torch

from algos.core import ROLLOUT_CORRECTIONS
from algos.core.importance_weights import mismatch_sums
from algos.system.distributed import sum_over_ranks

MISMATCH_KEYS = ("rollout_logp_abs_diff", "rollout_kl", "rollout_is_weight", "rollout_is_truncated", "rollout_is_masked")


def resolved_method(method: str, off_policy: bool) -> str:
    """loss.rollout_correction with "auto" resolved: "tis" for samples drawn off the trainer's weights (an engine's own
    copy, as TRL corrects vLLM's samples by default, or weights some steps old: rollout.max_staleness), "none" where
    the samples' log-probs are the trainer's."""
    if method != "auto":
        return method
    return "tis" if off_policy else "none"


def correction_weights(method: str, cap: float, old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor,
                       sums: dict[str, float] | None = None) -> torch.Tensor | float:
    """[n, T] weights pi_old / pi_rollout as ``method`` shapes them (1.0 for "none"); with ``sums``, the mismatch and
    the weights' statistics are added to it (once per update: measure each row once)."""
    if sums is not None:
        for key, value in mismatch_sums(old_logp, rollout_logp, mask).items():
            sums[key] = sums.get(key, 0.0) + value
    if method == "none":
        return 1.0
    weights, cut = ROLLOUT_CORRECTIONS[method](old_logp, rollout_logp, mask, cap)
    if sums is not None:
        for key, value in {"rollout_is_weight": (weights * mask).sum().item(), **cut}.items():
            sums[key] = sums.get(key, 0.0) + value
    return weights


def mismatch_metrics(sums: dict[str, float], num_tokens: float, num_seqs: float) -> dict[str, float]:
    """The update's mismatch metrics over every rank: means per loss token, or per sequence for masked rows; {} when
    no rank measured any (a backend without log-probs). Every rank calls it."""
    present = [key for key in MISMATCH_KEYS if key in sums]
    if not sum_over_ranks(len(present))[0]:
        return {}
    totals = dict(zip(MISMATCH_KEYS, sum_over_ranks(*(sums.get(key, 0.0) for key in MISMATCH_KEYS))))
    metrics = {"rollout_logp_abs_diff": totals["rollout_logp_abs_diff"] / num_tokens,
               "rollout_kl": totals["rollout_kl"] / num_tokens}
    if "rollout_is_weight" in present:
        metrics["rollout_is_weight_mean"] = totals["rollout_is_weight"] / num_tokens
        metrics["rollout_is_truncated_frac"] = totals["rollout_is_truncated"] / num_tokens
        metrics["rollout_is_masked_frac"] = totals["rollout_is_masked"] / max(1.0, num_seqs)
    return metrics
