"""Rollout/training mismatch correction (algos/core/importance_weights.py) against hand-computed values."""

import math

import pytest
import torch

from algos.core import ROLLOUT_CORRECTIONS
from algos.core.importance_weights import mismatch_sums, sequence_masked_is_weights, truncated_is_weights


def test_truncated_is_caps_each_tokens_weight_and_carries_no_gradient():
    # log pi_train - log pi_rollout: 0, log 3, log 0.5 | log 1.5, pad (a NaN the sampler left there is ignored)
    train = torch.log(torch.tensor([[0.2, 0.6, 0.1], [0.3, 0.5, 0.5]]))
    rollout = torch.log(torch.tensor([[0.2, 0.2, 0.2], [0.2, float("nan"), 0.5]]))
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    weights, stats = truncated_is_weights(train.requires_grad_(), rollout, mask, cap=2.0)
    torch.testing.assert_close(weights, torch.tensor([[1.0, 2.0, 0.5], [1.5, 0.0, 0.0]]))  # 3 truncated to 2
    assert not weights.requires_grad and stats == {"rollout_is_truncated": 1}
    assert ROLLOUT_CORRECTIONS["tis"] is truncated_is_weights


def test_sequence_masked_is_drops_sequences_whose_ratio_leaves_the_band():
    # row 0: ratios 1.5 and 1.2 -> 1.8 <= 2 kept; row 1: 3 -> masked; row 2: 0.4 < 1/2 -> masked; row 3: no tokens
    train = torch.log(torch.tensor([[0.3, 0.6], [0.6, 0.5], [0.2, 0.5], [0.5, 0.5]]))
    rollout = torch.log(torch.tensor([[0.2, 0.5], [0.2, 0.5], [0.5, 0.5], [0.5, 0.5]]))
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    weights, stats = sequence_masked_is_weights(train, rollout, mask, cap=2.0)
    torch.testing.assert_close(weights, torch.tensor([[1.8, 1.8], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]))
    assert stats == {"rollout_is_masked": 2}  # rows 1 and 2; row 3 has no token


def test_mismatch_sums_are_the_absolute_log_ratio_and_the_k3_kl():
    train = torch.log(torch.tensor([[0.5, 0.25]]))
    rollout = torch.log(torch.tensor([[0.25, 0.25]]))
    sums = mismatch_sums(train, rollout, torch.ones(1, 2))
    d = math.log(2)
    assert sums["rollout_logp_abs_diff"] == pytest.approx(d)
    assert sums["rollout_kl"] == pytest.approx(2 - d - 1)  # exp(d) - d - 1 on the first token, 0 on the second


def test_padding_never_reaches_a_weight_or_a_count():
    """A padded position (mask 0) may hold anything the sampler left there, NaN or a huge ratio: it changes no weight,
    no sequence ratio, no mismatch sum and no count. Ratios exactly at the cap are neither truncated nor masked."""
    train = torch.tensor([[math.log(2.0), 0.0, 30.0]], dtype=torch.float64)
    rollout = torch.tensor([[0.0, 0.0, float("nan")]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)
    weights, cut = truncated_is_weights(train, rollout, mask, cap=2.0)
    assert weights.tolist() == [[2.0, 1.0, 0.0]] and cut == {"rollout_is_truncated": 0}
    weights, cut = sequence_masked_is_weights(train, rollout, mask, cap=2.0)
    assert weights.tolist() == [[2.0, 2.0, 0.0]] and cut == {"rollout_is_masked": 0}
    sums = mismatch_sums(train, rollout, mask)
    assert sums["rollout_logp_abs_diff"] == pytest.approx(math.log(2.0))
    assert sums["rollout_kl"] == pytest.approx(1.0 - math.log(2.0))
    huge = torch.tensor([[30.0]], dtype=torch.float64)
    capped, cut = truncated_is_weights(huge, torch.zeros(1, 1, dtype=torch.float64), torch.ones(1, 1), cap=2.0)
    assert capped.tolist() == [[2.0]] and cut == {"rollout_is_truncated": 1}
    # a log-ratio past 20 counts as 20 in the KL: exp(20) - 30 - 1, not exp(30) - 31
    assert mismatch_sums(huge, torch.zeros(1, 1), torch.ones(1, 1))["rollout_kl"] == pytest.approx(math.exp(20) - 31)
