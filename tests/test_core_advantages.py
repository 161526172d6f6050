import math

import pytest
import torch

from algos.core.advantages import (
    ADVANTAGE_ESTIMATORS,
    batch_std_advantages,
    group_advantages,
    leave_one_out_advantages,
    mean_only_advantages,
    process_advantages,
    step_rewards_vary,
    zero_std_group_fraction,
)


def test_group_normalised_advantages_by_hand():
    # group 1: [1, 0, 0, 1] mean 0.5, unbiased std sqrt(1/3); group 2: all equal -> 0.
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])
    adv = group_advantages(scores, group_size=4, eps=0.0)
    s = 0.5 / math.sqrt(1 / 3)
    torch.testing.assert_close(adv[:4], torch.tensor([s, -s, -s, s]))
    torch.testing.assert_close(group_advantages(scores, group_size=4)[4:], torch.zeros(4))


def test_batch_scaling_uses_the_batch_std():
    scores = torch.tensor([1.0, 0.0, 3.0, 3.0])
    adv = batch_std_advantages(scores, group_size=2, eps=0.0)
    std = scores.std().item()  # unbiased std of [1, 0, 3, 3]
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, 0.0, 0.0]) / std)
    # the default eps is 1e-6, as for the group std
    torch.testing.assert_close(batch_std_advantages(scores, group_size=2), torch.tensor([0.5, -0.5, 0.0, 0.0]) / (std + 1e-6))


def test_one_row_groups_have_no_mean_only_signal():
    # G = 1 is a whole number of groups: each row is its group's mean, so Dr. GRPO's advantage is 0 and every group
    # has zero spread (the std-normalised estimators refuse G = 1 instead).
    torch.testing.assert_close(mean_only_advantages(torch.tensor([3.0, 5.0]), 1), torch.zeros(2))
    assert zero_std_group_fraction(torch.tensor([3.0, 5.0]), 1) == 1.0


def test_dr_grpo_is_mean_only():
    scores = torch.tensor([1.0, 0.0, 0.0, 0.0])
    torch.testing.assert_close(mean_only_advantages(scores, 4), torch.tensor([0.75, -0.25, -0.25, -0.25]))
    torch.testing.assert_close(ADVANTAGE_ESTIMATORS["dr-grpo"](scores, 4), mean_only_advantages(scores, 4))


def test_zero_std_group_fraction():
    assert zero_std_group_fraction(torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0]), 2) == pytest.approx(2 / 3)


def test_bad_group_size_and_scale_are_errors():
    with pytest.raises(ValueError, match="groups of 3"):
        group_advantages(torch.zeros(4), 3)
    with pytest.raises(ValueError, match="unknown advantage estimator 'rank'"):
        ADVANTAGE_ESTIMATORS["rank"]
    with pytest.raises(ValueError, match="group_size >= 2"):
        group_advantages(torch.zeros(4), 1)


def test_process_advantages_sum_normalised_future_steps():
    # One group of 2 completions, T = 4. Steps end at tokens (row 0: 1, 3), (row 1: 2).
    rewards = torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]])
    rewards[0, 3] = 4.0
    step_mask = torch.tensor([[0, 1, 0, 1], [0, 0, 1, 0]], dtype=torch.bool)
    adv = process_advantages(rewards, step_mask, group_size=2, eps=0.0)
    # steps [1, 4, 1]: mean 2, unbiased std sqrt(3) -> normalised [-1, 2, -1] / sqrt(3)
    n = 1 / math.sqrt(3)
    expected = torch.tensor([[n, n, 2 * n, 2 * n], [-n, -n, -n, 0.0]])
    torch.testing.assert_close(adv, expected)


def test_step_rewards_vary_per_group_over_masked_steps_only():
    # Two groups of 2 rows, T = 3. Group 0: steps 0.1 and 0.0 (varies); group 1: steps all 0.1, and a
    # large reward off the step mask that must not count.
    rewards = torch.tensor([[0.1, 0.0, 0.0], [0.0, 0.0, 0.0], [0.1, 0.0, 9.0], [0.0, 0.1, 0.0]])
    mask = torch.tensor([[1, 0, 0], [0, 1, 0], [1, 0, 0], [0, 1, 0]], dtype=torch.bool)
    assert step_rewards_vary(rewards, mask, group_size=2).tolist() == [True, False]
    assert step_rewards_vary(rewards, torch.zeros_like(mask), group_size=2).tolist() == [False, False]  # no steps


def test_default_eps_is_1e6_and_eps_is_added_to_the_std():
    scores = torch.tensor([0.0, 1.0])  # G = 2: mean 0.5, unbiased std sqrt(1/2)
    s = 0.5 / (math.sqrt(0.5) + 1e-6)
    torch.testing.assert_close(group_advantages(scores, group_size=2), torch.tensor([-s, s]))
    wide = 0.5 / (math.sqrt(0.5) + 0.5)
    torch.testing.assert_close(group_advantages(scores, group_size=2, eps=0.5), torch.tensor([-wide, wide]))


def test_process_advantages_normalise_per_group_with_one_or_two_steps():
    # group 0 (rows 0-1): one step of 0.3 -> mean 0.3, std 0 (count - 1 clamped at 1) -> 0
    # group 1 (rows 2-3): steps 1.0 (row 2, t=1) and 0.0 (row 3, t=0) -> mean 0.5, unbiased std sqrt(0.5)
    # group 2 (rows 4-5): steps 0.4 and 0.0 -> mean 0.2, unbiased std sqrt(0.08), its own
    rewards = torch.tensor([[0.3, 0.0], [0.0, 0.0], [0.0, 1.0], [0.0, 0.0], [0.4, 0.0], [0.0, 0.0]])
    mask = torch.tensor([[True, False], [False, False], [False, True], [True, False], [True, False], [True, False]])
    z = 0.5 / (math.sqrt(0.5) + 1e-6)  # the default eps
    y = 0.2 / (math.sqrt(0.08) + 1e-6)
    torch.testing.assert_close(process_advantages(rewards, mask, group_size=2),
                               torch.tensor([[0.0, 0.0], [0.0, 0.0], [z, z], [-z, 0.0], [y, 0.0], [-y, 0.0]]))


def test_process_advantages_refuse_mismatched_shapes_by_name():
    with pytest.raises(ValueError, match=r"step_rewards \(2, 3\) and step_mask \(2, 2\) differ"):
        process_advantages(torch.zeros(2, 3), torch.zeros(2, 2, dtype=torch.bool), group_size=2)


def test_step_rewards_vary_per_group():
    rewards = torch.tensor([[0.1, 0.0], [0.0, 0.0], [0.1, 0.0], [0.1, 0.0]])
    mask = torch.tensor([[True, False], [True, False], [True, False], [True, False]])
    assert step_rewards_vary(rewards, mask, group_size=2).tolist() == [True, False]


def test_group_std_works_from_two_rows():
    expected = torch.tensor([-1 / math.sqrt(2), 1 / math.sqrt(2)])
    torch.testing.assert_close(group_advantages(torch.tensor([1.0, 3.0]), 2, eps=0.0), expected)


def test_group_scaling_of_one_sample_groups_is_refused_in_so_many_words():
    with pytest.raises(ValueError, match=r"^the grpo advantage needs group_size >= 2 \(the std of one sample is undefined\)$"):
        group_advantages(torch.tensor([1.0, 2.0]), group_size=1)


def test_rloo_baseline_is_the_mean_of_the_other_rows():
    # group 1: [1, 0, 0, 1]: row 0's baseline is mean(0, 0, 1) = 1/3, so 1 - 1/3 = 2/3; row 1's is 2/3, so -2/3.
    # group 2: all equal -> 0. Same as G / (G - 1) * (R - group mean) = 4/3 * +-0.5.
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])
    expected = torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3, 0.0, 0.0, 0.0, 0.0])
    torch.testing.assert_close(leave_one_out_advantages(scores, group_size=4), expected)
    torch.testing.assert_close(ADVANTAGE_ESTIMATORS["rloo"](scores, 4), expected)
    with pytest.raises(ValueError, match="group_size >= 2"):
        leave_one_out_advantages(torch.zeros(4), 1)
