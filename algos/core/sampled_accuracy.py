"""Accuracy of N sampled answers per problem: the unbiased pass@k and the majority vote.

P = problems, N = samples per problem (a row of [P, N] holds one problem's samples).
"""

from __future__ import annotations

import torch


def pass_at_k(solved: torch.Tensor, k: int) -> torch.Tensor:
    """Bool[P, N] solved samples -> Float64[P] unbiased pass@k (Chen et al. 2021, the Codex paper): the chance that k
    of a problem's N samples, drawn without replacement, hold a solved one, 1 - C(N - c, k) / C(N, k) for c solved.
    pass@1 is the share solved (mean@N); pass@N whether any is."""
    samples = solved.shape[-1]
    if not 1 <= k <= samples:
        raise ValueError(f"pass@k needs 1 <= k <= the {samples} samples per problem, got k = {k}")
    unsolved = samples - solved.sum(-1, dtype=torch.float64)
    drawn = torch.arange(k, dtype=torch.float64, device=solved.device)
    # C(N - c, k) / C(N, k) as the product over j < k of (N - c - j) / (N - j): 0 once fewer than k are unsolved
    all_unsolved = ((unsolved[:, None] - drawn).clamp(min=0) / (samples - drawn)).prod(-1)
    return 1 - all_unsolved


def majority_solved(votes: torch.Tensor, solved: torch.Tensor) -> torch.Tensor:
    """Long[P, N] answer ids (-1: no answer, no vote), Bool[P, N] solved -> Bool[P]: whether the answer most samples
    gave is solved (maj@N). A tie goes to the answer given first; a problem with no answer at all is unsolved."""
    problems, samples = votes.shape
    counts = (votes[:, :, None] == votes[:, None, :]).sum(-1) * (votes >= 0)  # [P, N] votes for each sample's answer
    # the first sample among those with the most votes: argmax of count, ties broken towards earlier samples
    order = torch.arange(samples, 0, -1, device=votes.device)
    winner = (counts * (samples + 1) + order).argmax(-1)
    return (counts.amax(-1) > 0) & solved[torch.arange(problems, device=votes.device), winner]
