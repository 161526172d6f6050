"""Reduce a [B, T] per-token loss to a scalar, exactly across micro-batches.

Every mode divides by a normaliser the caller passes in (the count over the whole batch the
optimizer step covers), so summing the micro-batch losses (or their gradients) gives exactly the
full-batch loss. Modes are registered in LOSS_AGGREGATIONS: (masked loss [B, T], mask [B, T],
normalisers) -> [].
"""

from __future__ import annotations

import torch

from algos.core.variants import Registry

LOSS_AGGREGATIONS = Registry("loss aggregation")


def token_mean(masked: torch.Tensor, mask: torch.Tensor, num_tokens, num_seqs, token_budget) -> torch.Tensor:
    """[B, T] masked loss -> [] sum(loss) / num_tokens (DAPO's token-level loss)."""
    return masked.sum() / (num_tokens if num_tokens is not None else mask.sum().clamp(min=1))


LOSS_AGGREGATIONS.register("token-mean", token_mean)


def _per_sequence_mean(per_seq: torch.Tensor, mask: torch.Tensor, num_seqs) -> torch.Tensor:
    """[B] per-row losses -> [] their sum / num_seqs (default: rows with a valid token)."""
    return per_seq.sum() / (num_seqs if num_seqs is not None else (mask.sum(-1) > 0).sum().clamp(min=1))


def seq_mean_token_mean(masked: torch.Tensor, mask: torch.Tensor, num_tokens, num_seqs, token_budget) -> torch.Tensor:
    """[B, T] masked loss -> [] sum_i mean_t(loss_i) / num_seqs (GRPO's 1/|o_i| per sequence)."""
    return _per_sequence_mean(masked.sum(-1) / mask.sum(-1).clamp(min=1), mask, num_seqs)


LOSS_AGGREGATIONS.register("seq-mean-token-mean", seq_mean_token_mean)


def seq_mean_token_sum_norm(masked: torch.Tensor, mask: torch.Tensor, num_tokens, num_seqs, token_budget) -> torch.Tensor:
    """[B, T] masked loss -> [] sum_i sum_t(loss_i) / token_budget / num_seqs (Dr. GRPO; token_budget should be a
    constant such as max_new_tokens, default T of this tensor)."""
    budget = token_budget if token_budget is not None else mask.shape[-1]
    return _per_sequence_mean(masked.sum(-1) / budget, mask, num_seqs)


LOSS_AGGREGATIONS.register("seq-mean-token-sum-norm", seq_mean_token_sum_norm)


def aggregate_loss(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token-mean",
    *,
    global_num_tokens: float | None = None,
    global_num_seqs: float | None = None,
    token_budget: float | None = None,
) -> torch.Tensor:
    """[B, T] loss, [B, T] mask -> [] loss aggregated by LOSS_AGGREGATIONS[mode]; divisors default to this batch's
    own counts (rows with no valid token are not counted as sequences)."""
    aggregate = LOSS_AGGREGATIONS[mode]
    mask = mask.to(per_token_loss.dtype)
    return aggregate(per_token_loss * mask, mask, global_num_tokens, global_num_seqs, token_budget)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] values, [B, T] mask -> [] mean over masked entries (0 when there are none)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1)
