import math

import pytest
import torch

from algos.core.kl import kl_estimate


def test_estimators_by_hand():
    logp = torch.tensor([[math.log(0.5)]])
    ref = torch.tensor([[math.log(0.25)]])
    # log(pi/ref) = ln 2; ref/pi = 1/2
    assert kl_estimate(logp, ref, "k1").item() == pytest.approx(math.log(2))
    assert kl_estimate(logp, ref, "k2").item() == pytest.approx(0.5 * math.log(2) ** 2)
    assert kl_estimate(logp, ref, "k3").item() == pytest.approx(0.5 - math.log(0.5) - 1)


def test_k3_is_zero_at_equality_nonnegative_and_clamped():
    logp = torch.tensor([[-1.0, -2.0, -0.1]])
    assert kl_estimate(logp, logp, "k3").abs().max().item() == 0.0
    ref = torch.tensor([[-50.0, 30.0, -0.2]])
    kl = kl_estimate(logp, ref, "k3", clamp=10.0)
    assert torch.isfinite(kl).all() and (kl >= 0).all() and kl.max().item() == 10.0


def test_k3_reaches_its_clamp_with_a_gradient_up_to_it():
    # pi/pi_ref = e^10.5: k3 = e^-10.5 + 10.5 - 1 ~ 9.50003, still below the clamp of 10, so it keeps a gradient
    logp = torch.tensor([[10.5, 11.0]], requires_grad=True)
    kl = kl_estimate(logp, torch.zeros(1, 2), "k3", clamp=10.0)
    assert kl[0, 0].item() == pytest.approx(math.exp(-10.5) + 9.5) and kl[0, 1].item() == 10.0
    kl.sum().backward()
    assert logp.grad[0, 0].item() == pytest.approx(1 - math.exp(-10.5)) and logp.grad[0, 1].item() == 0.0


def test_unknown_estimator_is_named():
    with pytest.raises(ValueError, match="k4"):
        kl_estimate(torch.zeros(1, 1), torch.zeros(1, 1), "k4")


def test_the_default_is_k3_clamped_at_10():
    logp, ref = torch.tensor([[0.0, 0.0]]), torch.tensor([[math.log(0.5), 10.5]])
    torch.testing.assert_close(kl_estimate(logp, ref), kl_estimate(logp, ref, "k3", clamp=10.0))
    assert kl_estimate(logp, ref)[0, 1].item() == 10.0  # k3 = e^10.5 - 11.5, clamped


def test_k3_bounds_its_log_ratio_at_20_on_both_sides_and_k1_is_clamped_below_too():
    # log(pi_ref/pi) = +-30 is read as +-20 inside k3 (exp stays finite), whatever the output clamp
    logp, ref = torch.tensor([[0.0, 0.0]]), torch.tensor([[30.0, -30.0]])
    kl = kl_estimate(logp, ref, "k3", clamp=1e12)
    assert kl[0, 0].item() == pytest.approx(math.exp(20) - 21, rel=1e-6)
    assert kl[0, 1].item() == pytest.approx(math.exp(-20) + 19, rel=1e-6)
    assert kl_estimate(torch.tensor([[0.0]]), torch.tensor([[15.0]]), "k1").item() == -10.0
