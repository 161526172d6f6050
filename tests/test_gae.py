import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from algos.core.gae import (
    AdaptiveKLController,
    clipped_value_loss,
    explained_variance,
    gae_advantages,
    last_valid_index,
    masked_whiten,
    token_rewards,
    value_clip_fraction,
)


def loop_gae(rewards, values, mask, gamma, lam):
    """Reference: plain Python GAE over each row's valid tokens only."""
    advantages = [[0.0] * len(row) for row in rewards]
    for b, (r, v, m) in enumerate(zip(rewards, values, mask)):
        valid = [t for t, keep in enumerate(m) if keep]
        next_value, next_adv = 0.0, 0.0
        for t in reversed(valid):
            delta = r[t] + gamma * next_value - v[t]
            next_adv = delta + gamma * lam * next_adv
            next_value = v[t]
            advantages[b][t] = next_adv
    return advantages


def test_gae_matches_hand_computed_example():
    # One row, 3 valid tokens then padding; gamma 0.5, lambda 0.5.
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.25, 1.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    advantages, returns = gae_advantages(rewards, values, mask, gamma=0.5, lam=0.5)
    # delta2 = 1 + 0 - 1 = 0          -> A2 = 0
    # delta1 = 0 + .5*1 - .25 = .25   -> A1 = .25 + .25*0 = .25
    # delta0 = 0 + .5*.25 - .5 = -.375 -> A0 = -.375 + .25*.25 = -.3125
    torch.testing.assert_close(advantages, torch.tensor([[-0.3125, 0.25, 0.0, 0.0]]))
    torch.testing.assert_close(returns, torch.tensor([[0.1875, 0.5, 1.0, 0.0]]))


def test_gae_with_gamma_lambda_one_is_reward_to_go_minus_value():
    rewards = torch.tensor([[0.1, -0.2, 1.0]])
    values = torch.tensor([[0.3, 0.7, 0.2]])
    mask = torch.ones(1, 3, dtype=torch.long)
    advantages, returns = gae_advantages(rewards, values, mask, gamma=1.0, lam=1.0)
    reward_to_go = torch.tensor([[0.9, 0.8, 1.0]])
    torch.testing.assert_close(returns, reward_to_go)
    torch.testing.assert_close(advantages, reward_to_go - values)


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 4),
    steps=st.integers(1, 7),
    gamma=st.floats(0.5, 1.0),
    lam=st.floats(0.0, 1.0),
    seed=st.integers(0, 10_000),
)
def test_gae_matches_python_loop_with_holes_in_the_mask(rows, steps, gamma, lam, seed):
    generator = torch.Generator().manual_seed(seed)
    rewards = torch.randn(rows, steps, generator=generator, dtype=torch.float64)
    values = torch.randn(rows, steps, generator=generator, dtype=torch.float64)
    mask = (torch.rand(rows, steps, generator=generator) > 0.3).long()
    advantages, returns = gae_advantages(rewards, values, mask, gamma=gamma, lam=lam)
    expected = torch.tensor(loop_gae(rewards.tolist(), values.tolist(), mask.tolist(), gamma, lam), dtype=torch.float64)
    torch.testing.assert_close(advantages, expected)
    torch.testing.assert_close(returns, torch.where(mask.bool(), expected + values, 0.0))


def test_values_and_rewards_at_masked_tokens_do_not_matter():
    mask = torch.tensor([[0, 1, 1, 0, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1]])
    rewards = torch.randn(2, 7)
    values = torch.randn(2, 7)
    base_adv, base_ret = gae_advantages(rewards, values, mask, gamma=0.9, lam=0.8)
    garbage = torch.tensor([[float("nan"), 0, 0, float("inf"), 0, -1e6, 3.0], [0.0] * 7])
    hole = ~mask.bool()
    adv, ret = gae_advantages(
        torch.where(hole, garbage, rewards), torch.where(hole, garbage, values), mask, gamma=0.9, lam=0.8
    )
    torch.testing.assert_close(adv, base_adv)
    torch.testing.assert_close(ret, base_ret)
    assert torch.isfinite(adv).all() and (adv[hole] == 0).all()


def test_token_rewards_put_score_on_last_valid_token_and_kl_everywhere():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    scores = torch.tensor([1.0, 0.5, 7.0])
    kl = torch.full((3, 4), 0.1)
    process = torch.tensor([[0.2, 0.0, 0.0, 5.0], [0.0] * 4, [0.0] * 4])
    rewards = token_rewards(mask, scores, process_rewards=process, kl=kl, kl_coef=0.5)
    expected = torch.tensor([[0.15, -0.05, 0.95, 0.0], [0.45, 0.0, 0.0, 0.0], [0.0] * 4])
    torch.testing.assert_close(rewards, expected)
    assert last_valid_index(mask).tolist() == [2, 0, -1]


def test_masked_whiten_uses_only_valid_tokens():
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 5.0, -50.0, 6.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 1]])
    out = masked_whiten(x, mask)
    valid = out[mask.bool()]
    assert abs(valid.mean().item()) < 1e-6
    assert abs(valid.std().item() - 1.0) < 1e-4  # Bessel-corrected, as the mean/std used
    assert (out[~mask.bool()] == 0).all()
    kept_mean = masked_whiten(x, mask, shift_mean=False)[mask.bool()]
    assert abs(kept_mean.mean().item() - 3.5) < 1e-5


def test_clipped_value_loss_takes_the_pessimistic_term():
    old = torch.tensor([[0.0, 0.0, 0.0]])
    returns = torch.tensor([[1.0, 1.0, -1.0]])
    # token 0: moved far toward R (clipped term larger); token 1: inside the clip range;
    # token 2: moved far away from R (unclipped term larger).
    values = torch.tensor([[0.9, 0.1, 0.5]], requires_grad=True)
    loss, clipped = clipped_value_loss(values, old, returns, clip_range=0.2)
    expected = 0.5 * torch.tensor([[(0.2 - 1.0) ** 2, (0.1 - 1.0) ** 2, (0.5 + 1.0) ** 2]])
    torch.testing.assert_close(loss, expected)
    assert clipped.tolist() == [[True, False, False]]
    loss.sum().backward()
    # clipped token gets no gradient; the others get V - R
    torch.testing.assert_close(values.grad, torch.tensor([[0.0, -0.9, 1.5]]))
    mask = torch.tensor([[1, 1, 0]])
    assert value_clip_fraction(clipped, mask).item() == pytest.approx(0.5)
    plain, never = clipped_value_loss(values.detach(), old, returns, clip_range=None)
    torch.testing.assert_close(plain, 0.5 * (values.detach() - returns) ** 2)
    assert not never.any()


def test_explained_variance():
    returns = torch.tensor([[1.0, 2.0, 3.0, 99.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    assert explained_variance(returns.clone(), returns, mask).item() == pytest.approx(1.0)
    constant = torch.full_like(returns, 2.0)
    assert explained_variance(constant, returns, mask).item() == pytest.approx(0.0, abs=1e-6)
    assert math.isnan(explained_variance(constant, torch.ones_like(returns), mask).item())


def test_adaptive_kl_controller_moves_toward_target_and_fixed_stays():
    adaptive = AdaptiveKLController(coef=0.1, target=1.0, horizon=100)
    assert adaptive.update(observed_kl=2.0, n_steps=10) == pytest.approx(0.1 * (1 + 0.2 * 0.1))  # error clipped at 0.2
    assert adaptive.update(observed_kl=0.9, n_steps=10) < 0.1 * 1.02
    restored = AdaptiveKLController(coef=0.0)
    restored.load_state_dict(adaptive.state_dict())
    assert restored == adaptive
    fixed = AdaptiveKLController(coef=0.05)
    assert fixed.update(observed_kl=10.0, n_steps=100) == 0.05
    with pytest.raises(ValueError, match="target"):
        AdaptiveKLController(coef=0.1, target=0.0)


def test_gae_defaults_are_gamma_1_and_lambda_095():
    rewards, values, mask = torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.2, 0.4, 0.6]]), torch.ones(1, 3)
    for got, want in zip(gae_advantages(rewards, values, mask), gae_advantages(rewards, values, mask, gamma=1.0, lam=0.95)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    # and they are not gamma = lambda = 1: A_0 = delta_0 + 0.95 delta_1 + 0.95^2 delta_2
    deltas = [0.4 - 0.2, 0.6 - 0.4, 1.0 - 0.6]
    expected = deltas[0] + 0.95 * deltas[1] + 0.95**2 * deltas[2]
    assert gae_advantages(rewards, values, mask)[0][0, 0].item() == pytest.approx(expected)


def test_masked_whiten_adds_eps_to_the_variance_and_two_tokens_divide_by_one():
    x, mask = torch.tensor([[1.0, 3.0, 99.0]]), torch.tensor([[1, 1, 0]])  # mean 2, unbiased var (1 + 1) / 1 = 2
    torch.testing.assert_close(masked_whiten(x, mask, eps=0.5), torch.tensor([[-1 / math.sqrt(2.5), 1 / math.sqrt(2.5), 0.0]]))
    from algos.core.gae import masked_mean_std

    assert masked_mean_std(x, mask) == pytest.approx((2.0, math.sqrt(2.0)))


def test_token_rewards_keep_the_inputs_float_dtype_and_take_any_subset_of_terms():
    mask = torch.tensor([[1, 1, 0]])
    kl = torch.tensor([[0.5, 1.0, 7.0]], dtype=torch.float64)
    only_kl = token_rewards(mask, None, kl=kl, kl_coef=1.0)  # no score: a KL penalty alone, coefficient 1
    assert only_kl.dtype == torch.float64
    torch.testing.assert_close(only_kl, torch.tensor([[-0.5, -1.0, 0.0]], dtype=torch.float64))
    scores = torch.tensor([2.0], dtype=torch.float64)
    assert token_rewards(mask, scores).dtype == torch.float64
    # a coefficient without a KL tensor is no KL term (not an error)
    torch.testing.assert_close(token_rewards(mask, torch.tensor([2.0]), kl_coef=0.1), torch.tensor([[0.0, 2.0, 0.0]]))


def test_value_loss_flags_are_bool_and_explained_variance_keeps_the_dtype():
    values = torch.tensor([[1.0, 2.0]])
    assert clipped_value_loss(values, values, values, None)[1].dtype == torch.bool
    flat = torch.ones(1, 3, dtype=torch.float64)
    result = explained_variance(flat, flat, torch.ones(1, 3))  # returns without variance: nan, in their dtype
    assert math.isnan(result.item()) and result.dtype == torch.float64


def test_adaptive_kl_controller_refuses_bad_settings_by_name():
    with pytest.raises(ValueError, match="kl coef must be >= 0"):
        AdaptiveKLController(-0.1)
    with pytest.raises(ValueError, match="kl horizon must be > 0"):
        AdaptiveKLController(0.1, target=1.0, horizon=0)


def test_a_kl_tensor_without_a_coefficient_costs_nothing():
    mask, kl = torch.ones(1, 2), torch.tensor([[0.5, 0.5]])
    torch.testing.assert_close(token_rewards(mask, torch.tensor([1.0]), kl=kl), torch.tensor([[0.0, 1.0]]))
