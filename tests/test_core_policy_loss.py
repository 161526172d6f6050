import math

import pytest
import torch

from algos.core.policy_loss import POLICY_LOSSES, cispo_policy_loss, clipped_policy_loss, gmpo_policy_loss, gspo_policy_loss


def _logp(ratios):
    return torch.log(torch.tensor([ratios]))


def test_clipped_surrogate_by_hand_with_asymmetric_clip():
    # ratios 0.5, 1.1, 1.5, 0.7 with A = +1, +1, +1, -1; eps_low 0.2, eps_high 0.28.
    logp = _logp([0.5, 1.1, 1.5, 0.7])
    old = torch.zeros_like(logp)
    adv = torch.tensor([[1.0, 1.0, 1.0, -1.0]])
    mask = torch.ones_like(logp)
    out = clipped_policy_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28)
    # loss = max(-A r, -A clip(r)): [-0.5, -1.1, -1.28, 0.8]
    torch.testing.assert_close(out.per_token_loss, torch.tensor([[-0.5, -1.1, -1.28, 0.8]]))
    assert out.stats["clip_frac_high"] == pytest.approx(0.25)  # 1.5 with A > 0
    assert out.stats["clip_frac_low"] == pytest.approx(0.25)  # 0.7 with A < 0
    assert out.stats["ratio_min"] == pytest.approx(0.5)
    assert out.stats["ratio_max"] == pytest.approx(1.5)
    assert out.stats["ratio_mean"] == pytest.approx(3.8 / 4)


def test_gradient_is_zero_where_clipping_is_active():
    logp = _logp([1.5, 0.7]).requires_grad_()
    out = clipped_policy_loss(logp, torch.zeros(1, 2), torch.tensor([[1.0, -1.0]]), torch.ones(1, 2))
    out.per_token_loss.sum().backward()
    assert logp.grad.abs().max().item() == 0.0


def test_dual_clip_bounds_negative_advantage_loss():
    logp = _logp([5.0, 5.0])
    adv = torch.tensor([[-1.0, 1.0]])
    out = clipped_policy_loss(logp, torch.zeros(1, 2), adv, torch.ones(1, 2), dual_clip=3.0)
    # A<0: min(max(5, 1.2), 3) = 3 ; A>0: max(-5, -1.2) = -1.2
    torch.testing.assert_close(out.per_token_loss, torch.tensor([[3.0, -1.2]]))
    assert out.stats["dual_clip_frac"] == pytest.approx(0.5)


def test_masked_tokens_are_zero_and_excluded_from_stats():
    logp = _logp([2.0, 100.0])
    out = clipped_policy_loss(logp, torch.zeros(1, 2), torch.tensor([1.0]), torch.tensor([[1, 0]]))
    assert out.per_token_loss[0, 1].item() == 0.0
    assert out.stats["ratio_max"] == pytest.approx(2.0)


def test_gspo_sequence_ratio_is_geometric_mean_of_valid_tokens():
    # token ratios 2 and 1/2 (and a masked 9): geometric mean 1 -> unclipped, loss -A.
    logp = _logp([2.0, 0.5, 9.0])
    mask = torch.tensor([[1, 1, 0]])
    out = gspo_policy_loss(logp, torch.zeros(1, 3), torch.tensor([2.0]), mask)
    torch.testing.assert_close(out.per_token_loss, torch.tensor([[-2.0, -2.0, 0.0]]))
    assert out.stats["ratio_mean"] == pytest.approx(1.0)
    assert math.isclose(out.stats["clip_frac_high"], 0.0)


def test_bad_options_are_named():
    z = torch.zeros(1, 1)
    with pytest.raises(ValueError, match="unknown policy loss 'word'"):
        POLICY_LOSSES["word"]
    with pytest.raises(ValueError, match="dual_clip"):
        clipped_policy_loss(z, z, z, z, dual_clip=0.5)


def test_dual_clip_of_exactly_one_is_refused():
    z = torch.zeros(1, 1)
    with pytest.raises(ValueError, match="dual_clip"):
        clipped_policy_loss(z, z, z, z, dual_clip=1.0)


def test_ratio_is_capped_at_exp_20_before_it_can_overflow():
    out = clipped_policy_loss(torch.tensor([[20.5]]), torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1))
    assert out.stats["ratio_max"] == pytest.approx(math.exp(20.0), rel=1e-6)


def test_a_batch_without_valid_tokens_reports_neutral_ratio_stats():
    out = clipped_policy_loss(_logp([2.0, 0.5]), torch.zeros(1, 2), torch.tensor([1.0]), torch.zeros(1, 2))
    assert (out.stats["ratio_min"], out.stats["ratio_mean"], out.stats["ratio_max"]) == (1.0, 1.0, 1.0)
    assert out.per_token_loss.abs().sum().item() == 0.0


def test_gspo_ratio_of_a_one_token_row_is_that_tokens_ratio():
    # one valid token of ratio 1.5 beside padding: the sequence ratio is 1.5 (its length is 1), clipped at 1.2 for A > 0
    out = gspo_policy_loss(_logp([1.5, 3.0]), torch.zeros(1, 2), torch.tensor([1.0]), torch.tensor([[1, 0]]))
    assert out.stats["ratio_max"] == pytest.approx(1.5)
    torch.testing.assert_close(out.per_token_loss, torch.tensor([[-1.2, 0.0]]))


def test_gspo_clips_at_the_default_range_and_applies_the_dual_clip():
    # ratios 0.25 and 1 (geometric mean 0.5), A = -1: clipped at 1 - 0.2 by default, loss max(0.5, 0.8) = 0.8 per token
    mask, negative = torch.ones(1, 2), torch.tensor([-1.0])
    low = gspo_policy_loss(_logp([0.25, 1.0]), torch.zeros(1, 2), negative, mask)
    torch.testing.assert_close(low.per_token_loss, torch.tensor([[0.8, 0.8]]))
    # ratios 2 and 8 (geometric mean 4), A = -1: loss max(4, 1.2) = 4, which dual clip 3 bounds at 3
    high = _logp([2.0, 8.0])
    unbounded = gspo_policy_loss(high, torch.zeros(1, 2), negative, mask)
    torch.testing.assert_close(unbounded.per_token_loss, torch.tensor([[4.0, 4.0]]))
    bounded = gspo_policy_loss(high, torch.zeros(1, 2), negative, mask, dual_clip=3.0)
    torch.testing.assert_close(bounded.per_token_loss, torch.tensor([[3.0, 3.0]]))
    assert bounded.stats["dual_clip_frac"] == 1.0


def test_cispo_clips_and_detaches_the_weight_so_every_token_keeps_its_gradient():
    # ratios 0.5, 1.1, 1.5 with A = +1, -1, +2; eps_low 0.2, eps_high 0.28: weights 0.8, 1.1, 1.28 (detached).
    logp = _logp([0.5, 1.1, 1.5]).requires_grad_()
    out = cispo_policy_loss(logp, torch.zeros(1, 3), torch.tensor([[1.0, -1.0, 2.0]]), torch.ones(1, 3), 0.2, 0.28)
    # loss = -w A log pi: [-0.8 log 0.5, 1.1 log 1.1, -2.56 log 1.5]
    expected = torch.tensor([[-0.8 * math.log(0.5), 1.1 * math.log(1.1), -2.56 * math.log(1.5)]])
    torch.testing.assert_close(out.per_token_loss.detach(), expected)
    out.per_token_loss.sum().backward()
    # d/dlogp = -w A: the clipped tokens (0.5 and 1.5) still get a gradient, unlike the clipped surrogate's
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.8, 1.1, -2.56]]))
    assert out.stats["clip_frac_low"] == pytest.approx(1 / 3) and out.stats["clip_frac_high"] == pytest.approx(1 / 3)
    # eps_low = 1 (the paper's): no lower bound on the weight
    unbounded = cispo_policy_loss(_logp([0.5]), torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1), 1.0, 0.28)
    torch.testing.assert_close(unbounded.per_token_loss, torch.tensor([[-0.5 * math.log(0.5)]]))
    assert POLICY_LOSSES["cispo"] is cispo_policy_loss


def test_gmpo_is_the_geometric_mean_of_the_token_ratios_clipped_for_the_sign_of_a():
    # row 0: A = +1, log-ratios 0.1, 0.6, -0.6 (eps 0.4): A > 0 caps the upper side only -> 0.1, 0.4, -0.6
    # row 1: A = -2, log-ratios 0.6, -0.6, pad: A < 0 caps the lower side only -> 0.6, -0.4
    log_ratio = torch.tensor([[0.1, 0.6, -0.6], [0.6, -0.6, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    logp = log_ratio.clone().requires_grad_()
    out = gmpo_policy_loss(logp, torch.zeros(2, 3), torch.tensor([1.0, -2.0]), mask, 0.4, 0.4)
    ratio_0, ratio_1 = math.exp((0.1 + 0.4 - 0.6) / 3), math.exp((0.6 - 0.4) / 2)
    expected = torch.tensor([[-ratio_0] * 3, [2 * ratio_1, 2 * ratio_1, 0.0]])
    torch.testing.assert_close(out.per_token_loss.detach(), expected)
    out.per_token_loss.sum().backward()  # each row's loss sits on its T_i tokens: T_i x -A_i ratio_i / T_i per free token
    torch.testing.assert_close(logp.grad, torch.tensor([[-ratio_0, 0.0, -ratio_0], [2 * ratio_1, 0.0, 0.0]]))
    assert out.stats["clip_frac_high"] == pytest.approx(1 / 5) and out.stats["clip_frac_low"] == pytest.approx(1 / 5)
    with pytest.raises(ValueError, match="one advantage per row"):
        gmpo_policy_loss(logp, torch.zeros(2, 3), torch.zeros(2, 3), mask)
