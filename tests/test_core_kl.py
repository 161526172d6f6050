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


def test_unknown_estimator_is_named():
    with pytest.raises(ValueError, match="k4"):
        kl_estimate(torch.zeros(1, 1), torch.zeros(1, 1), "k4")
