"""Reduce a [B, T] per-token loss to a scalar, correctly across micro-batches and ranks.

Every mode divides by a *global* normaliser passed in by the caller (the count
over the whole batch on all ranks), so summing the micro-batch losses (or their
gradients) gives exactly the full-batch loss.
"""

from __future__ import annotations

import torch

MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def aggregate_loss(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token-mean",
    *,
    global_num_tokens: float | None = None,
    global_num_seqs: float | None = None,
    token_budget: float | None = None,
) -> torch.Tensor:
    """[B, T] loss, [B, T] mask -> [] loss; divisors default to this batch's own counts.

    token-mean: sum(loss) / global_num_tokens (DAPO's token-level loss).
    seq-mean-token-mean: sum_i mean_t(loss_i) / global_num_seqs (GRPO's 1/|o_i| per sequence).
    seq-mean-token-sum-norm: sum_i sum_t(loss_i) / token_budget / global_num_seqs (Dr. GRPO; token_budget
      should be a constant such as max_new_tokens, default T of this tensor).
    Rows with no valid token are not counted as sequences by default.
    """
    if mode not in MODES:
        raise ValueError(f"loss aggregation mode must be one of {MODES}, got {mode!r}")
    mask = mask.to(per_token_loss.dtype)
    masked = per_token_loss * mask
    tokens_per_seq = mask.sum(-1)
    if mode == "token-mean":
        divisor = global_num_tokens if global_num_tokens is not None else tokens_per_seq.sum().clamp(min=1)
        return masked.sum() / divisor
    num_seqs = global_num_seqs if global_num_seqs is not None else (tokens_per_seq > 0).sum().clamp(min=1)
    if mode == "seq-mean-token-mean":
        per_seq = masked.sum(-1) / tokens_per_seq.clamp(min=1)
    else:
        per_seq = masked.sum(-1) / (token_budget if token_budget is not None else mask.shape[-1])
    return per_seq.sum() / num_seqs


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] values, [B, T] mask -> [] mean over masked entries (0 when there are none)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1)
